#!/usr/bin/env bash
# Issue 37's kernel half on one H200: the FP8 route of patch 05 (the activations' quantization included) beside
# bf16, Marlin and patch 04's dispatch at M = 1..16384 on every SALA shape (`soarpack kernels`, with its thresholds
# and the bar), and the per-linear numerics of the FP8 route beside the fork's own --quantization fp8 linear
# (benchmarks/gpu_fp8_prefill.py numerics, the fork's code imported). From the repository root on the device
# (benchmarks/RESULTS.md §10, "The device calls"):
#
#   timeout -s TERM 590 bash benchmarks/gpu_fp8_prefill.sh     # again in a second call if the first ran out of time
#
# Steps that finished are kept in /tmp/f8 (a warm machine keeps /tmp between calls) and skipped by the next call:
# 0. the carried site and the fork (device_run.sh install), patches 04 + 05 onto a copy, the fork's Marlin built from
#    .whl/marlin-src-d29fb130c.tar.gz unless $MARLIN_SO (or .whl/*marlin*.so, .gpu/*marlin*.so) is given;
# 1. numerics; 2. soarpack kernels; 3. the markdown tables.
# Carry .whl (benchmarks/gpu_serve/fetch_wheels.py: sglang-kernel 0.4.5, whose sm90 ops hold fp8_scaled_mm and
# sgl_per_token_quant_fp8; pydantic; the fork's tarball; the Marlin sources or a built .so). Every call brings back
# in $OUT what exists so far: gpu_fp8_prefill.txt (this output), numerics.txt, fp8-numerics.json, kernels-fp8.txt,
# kernels-fp8.json, fp8-tables.md (the markdown for RESULTS.md §10).
set -uo pipefail
FINAL=${OUT:-/tmp/out}; K=/tmp/f8; mkdir -p "$FINAL" "$K"
collect() { cp "$K"/numerics.txt "$K"/fp8-numerics.json "$K"/kernels-fp8.txt "$K"/kernels-fp8.json "$K"/fp8-tables.md "$FINAL"/ 2>/dev/null; }
trap collect EXIT
trap 'trap - EXIT; collect; exit 143' TERM
exec > >(tee -a "$FINAL/gpu_fp8_prefill.txt") 2>&1
ROOT=$(cd "$(dirname "$0")/.." && pwd); cd "$ROOT"
GS=benchmarks/gpu_serve; SITE=/tmp/serve-site; FORK=/tmp/fork/python; F8=$K/fork-f8/python
MARLIN_SO=${MARLIN_SO:-$(ls .whl/*marlin*.so .gpu/*marlin*.so /tmp/mb/*marlin*.so 2>/dev/null | head -1)}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
step() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv,noheader

step "0. the carried site and the fork, patches 04 + 05, Marlin"
if [ ! -d "$SITE/sgl_kernel" ] || [ ! -d "$FORK" ]; then OUT=$K/install bash $GS/device_run.sh install || exit 1; fi
[ -d "$F8" ] || PYTHONPATH=$ROOT python3 -m soarpack.serve.patches apply --src $FORK --out $F8 \
  --patch w4-dispatch --patch fp8-prefill > /dev/null || exit 1
echo "fp8-prefill blocks in the patched marlin_utils.py: $(grep -c 'soarpack fp8-prefill: begin' $F8/sglang/srt/layers/quantization/marlin_utils.py)"
if [ -z "$MARLIN_SO" ] && [ -f .whl/marlin-src-d29fb130c.tar.gz ]; then
  mkdir -p /tmp/marlin-src && tar -xzf .whl/marlin-src-d29fb130c.tar.gz -C /tmp/marlin-src &&
    python3 benchmarks/build_marlin_ext.py --src /tmp/marlin-src/sgl-kernel --build /tmp/mb --jobs 14 | tail -3
  MARLIN_SO=$(ls /tmp/mb/*marlin*.so 2>/dev/null | head -1)
fi
case "$MARLIN_SO" in ""|/*) ;; *) MARLIN_SO=$ROOT/$MARLIN_SO ;; esac
echo "Marlin: ${MARLIN_SO:-NONE (the kernel table has no Marlin column)}"
PYTHONPATH=$SITE python3 -c "import sgl_kernel, torch; print('sgl_kernel', sgl_kernel.__file__); \
print('fp8 ops:', [n for n in ('fp8_scaled_mm', 'sgl_per_token_quant_fp8') if hasattr(torch.ops.sgl_kernel, n)])"

step "1. numerics: patch 05's route and the fork's own --quantization fp8 linear vs the bf16 matmul"
if [ ! -s $K/fp8-numerics.json ]; then
  PYTHONPATH=$ROOT/$GS/shim:$F8:$SITE:$ROOT SOARPACK_MARLIN_SO=$MARLIN_SO timeout 240 \
    python3 benchmarks/gpu_fp8_prefill.py numerics --fork $F8 --json $K/fp8-numerics.json > $K/numerics.txt 2>&1
  echo "rc=$?"
fi
tail -45 $K/numerics.txt

step "2. soarpack kernels: bf16, Marlin, dispatch, FP8 route, every built-in recipe, M = 1..16384"
if [ ! -s $K/kernels-fp8.json ]; then
  PYTHONPATH=$SITE:$ROOT timeout 400 python3 -m soarpack kernels ${MARLIN_SO:+--marlin-ext $MARLIN_SO} \
    -o $K/kernels-fp8.json > $K/kernels-fp8.txt 2>&1
  echo "rc=$?"
fi
tail -25 $K/kernels-fp8.txt

step "3. the tables for RESULTS.md §10"
[ -s $K/kernels-fp8.json ] && [ -s $K/fp8-numerics.json ] &&
  PYTHONPATH=$SITE:$ROOT python3 benchmarks/gpu_fp8_prefill.py render --kernels $K/kernels-fp8.json \
    --numerics $K/fp8-numerics.json > $K/fp8-tables.md 2>&1 && grep -A3 "^Bar" $K/fp8-tables.md
step "done"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
