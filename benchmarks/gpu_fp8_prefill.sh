#!/usr/bin/env bash
# Issue 37's kernel half on one H200, one device call (about 8 minutes cold): the FP8 route of patch 05 (the
# activations' quantization included) beside bf16, Marlin and patch 04's dispatch at M = 1..16384 on every SALA shape
# (`soarpack kernels`, with its thresholds and the bar), and the per-linear numerics of the FP8 route beside the
# fork's own --quantization fp8 linear (benchmarks/gpu_fp8_prefill.py numerics, the fork's code imported). Run from
# the repository root on the device (benchmarks/gpu_serve/README.md, "Issue 37: not yet run on a GPU"):
#
#   timeout -s TERM 590 bash benchmarks/gpu_fp8_prefill.sh
#
# Carry .whl (benchmarks/gpu_serve/fetch_wheels.py: sglang-kernel 0.4.5, whose sm90 ops hold fp8_scaled_mm and
# sgl_per_token_quant_fp8, pydantic, the fork's tarball) and the Marlin extension at $MARLIN_SO (default: the first
# .whl/*marlin*.so or .gpu/*marlin*.so; sglang-kernel 0.4.5 has no Marlin). Results in $OUT: kernels-fp8.json/.txt,
# fp8-numerics.json, fp8-tables.md (the markdown for RESULTS.md §9), gpu_fp8_prefill.txt (this output).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_fp8_prefill.txt") 2>&1
ROOT=$(cd "$(dirname "$0")/.." && pwd); cd "$ROOT"
GS=benchmarks/gpu_serve; SITE=/tmp/serve-site; FORK=/tmp/fork/python; F8=/tmp/fork-f8/python
MARLIN_SO=${MARLIN_SO:-$(ls .whl/*marlin*.so .gpu/*marlin*.so 2>/dev/null | head -1)}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
step() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv,noheader

step "0. install the carried site and the fork (device_run.sh install), patches 04 + 05 onto a copy"
[ -d "$SITE/sgl_kernel" ] && [ -d "$FORK" ] || OUT=/tmp/f8-install bash $GS/device_run.sh install || exit 1
[ -d "$F8" ] || PYTHONPATH=$ROOT python3 -m soarpack.serve.patches apply --src $FORK --out $F8 \
  --patch w4-dispatch --patch fp8-prefill > /dev/null || exit 1
grep -c "soarpack fp8-prefill: begin" $F8/sglang/srt/layers/quantization/marlin_utils.py
PYTHONPATH=$SITE python3 -c "import sgl_kernel, torch; print('sgl_kernel', sgl_kernel.__file__); \
print('fp8 ops:', [n for n in ('fp8_scaled_mm', 'sgl_per_token_quant_fp8') if hasattr(torch.ops.sgl_kernel, n)])"
[ -n "$MARLIN_SO" ] || echo "NO Marlin extension: the kernel table has no Marlin column"

step "1. numerics: patch 05's route and the fork's own --quantization fp8 linear vs the bf16 matmul"
PYTHONPATH=$ROOT/$GS/shim:$F8:$SITE:$ROOT SOARPACK_MARLIN_SO=${MARLIN_SO:+$ROOT/$MARLIN_SO} timeout 200 \
  python3 benchmarks/gpu_fp8_prefill.py numerics --fork $F8 --json "$OUT/fp8-numerics.json" > "$OUT/numerics.txt" 2>&1
echo "rc=$?"; tail -45 "$OUT/numerics.txt"

step "2. soarpack kernels: bf16, Marlin, dispatch, FP8 route, every built-in recipe, M = 1..16384"
PYTHONPATH=$SITE:$ROOT timeout 330 python3 -m soarpack kernels ${MARLIN_SO:+--marlin-ext $ROOT/$MARLIN_SO} \
  -o "$OUT/kernels-fp8.json" > "$OUT/kernels-fp8.txt" 2>&1
echo "rc=$?"; tail -25 "$OUT/kernels-fp8.txt"

step "3. the tables for RESULTS.md §9"
PYTHONPATH=$SITE:$ROOT python3 benchmarks/gpu_fp8_prefill.py render --kernels "$OUT/kernels-fp8.json" \
  --numerics "$OUT/fp8-numerics.json" > "$OUT/fp8-tables.md" 2>&1
grep -A3 "^Bar" "$OUT/fp8-tables.md"
step "done"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
