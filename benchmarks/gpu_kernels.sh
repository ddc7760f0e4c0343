#!/usr/bin/env bash
# Issue 30's device call (one call, ~5 min on one H200): the split-K W4 kernel's numerics on the GPU (bf16 included),
# the dispatch benchmark with the split-K route, and `soarpack kernels` end to end, whose table should match the
# benchmark's within noise. Run from the repository root on the device:
#
#   bash benchmarks/gpu_kernels.sh
#
# Carry (both ignored by git, so prepare them in the tree first; see benchmarks/RESULTS.md §6):
#   .device/soarpack_marlin.so   the prebuilt fork Marlin (cp /work/main/.gpu/prebuilt/soarpack_marlin.so .device/)
#   .whl/                        pydantic and its deps for CPython 3.12 (the device image has typer, rich, pytest,
#                                triton, but no pydantic, which soarpack's recipes need)
# Results land in $OUT: gpu_kernels.txt (this output), w4_dispatch.json/.md/.log, kernels.json/.txt, pytest.txt.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_kernels.txt") 2>&1
export PYTHONUNBUFFERED=1
SO=${SO:-.device/soarpack_marlin.so}
export PYTHONPATH=$PWD
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "import pydantic, typer; print('pydantic', pydantic.__version__)" || echo "NO PYDANTIC: step 3 will fail (carry .whl)"
python3 -c "import sgl_kernel" 2> /dev/null && echo "sgl_kernel imports: it is the Marlin measured" || echo "no sgl_kernel: Marlin = $SO"
[ -f "$SO" ] || echo "NO $SO: Marlin is not measured (bf16, dequant, split-K only)"
T0=$(date +%s)
step() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }

step "1. split-K numerics on the GPU (pytest)"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_splitk.py > "$OUT/pytest.txt" 2>&1
echo "rc=$?"; tail -5 "$OUT/pytest.txt"

step "2. benchmark: bf16 / Marlin / dq+mm / split-K / dispatch, every shape, W4 and W8"
timeout 330 python3 benchmarks/gpu_w4_dispatch.py --ext "$SO" --json "$OUT/w4_dispatch.json" --splitk-sweep \
  > "$OUT/w4_dispatch.log" 2>&1
echo "rc=$?"; grep -A40 "^| shape (class) | M | read floor" "$OUT/w4_dispatch.log" | head -45; tail -22 "$OUT/w4_dispatch.log"
python3 benchmarks/gpu_w4_dispatch.py --render "$OUT/w4_dispatch.json" > "$OUT/w4_dispatch.md" 2>&1

step "3. soarpack kernels, every built-in recipe"
timeout 240 python3 -m soarpack kernels --marlin-ext "$SO" --out "$OUT/kernels.json" > "$OUT/kernels.txt" 2>&1
echo "rc=$?"; tail -30 "$OUT/kernels.txt"
python3 benchmarks/gpu_w4_dispatch.py --render "$OUT/w4_dispatch.json" --compare-kernels "$OUT/kernels.json"

step "done"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
