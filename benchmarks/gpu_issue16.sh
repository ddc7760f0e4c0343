#!/usr/bin/env bash
# Issue 16's GPU measurements; one or more modes per device call (a call may run 10 minutes on one H200):
#
#   bash benchmarks/gpu_issue16.sh kernels  # the hot products alone: GLA (torch vs fla, calibration shape) and the
#                                           # Hessian XᵀX (GPTQModel's fp32 vs soarpack's bf16 GEMM)   (~1 min)
#   bash benchmarks/gpu_issue16.sh pair     # 8 layers: soarpack vs GPTQModel's defaults, both cold (fresh Triton
#                                           # and JIT caches each), same model, same 256 rows       (~3-4 min)
#   bash benchmarks/gpu_issue16.sh full     # 32 layers, soarpack, torch's allocator capped at 16 GiB, cold (~4 min)
#   bash benchmarks/gpu_issue16.sh same     # 8 layers, cold, through `soarpack quantize`: the pre-change tree
#                                           # (.device/old, carried), this tree as it was (fla GLA, fp32 Hessians)
#                                           # and this tree's defaults; then the defaults again with the CUDA block
#                                           # update built before GPTQ starts (warm: no eager layers); every
#                                           # written tensor compared (128 rows, to fit one call)      (~7 min)
#   bash benchmarks/gpu_issue16.sh kernels pair
#
# Carry `.whl` (and `.device/old` for `same`). Results land in $OUT (JSON, gzipped logs, this script's output).
set -o pipefail
MODES=("$@"); [ ${#MODES[@]} -gt 0 ] || { echo "usage: $0 kernels|pair|full|same ..."; exit 2; }
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run-$(IFS=-; echo "${MODES[*]}").txt") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
W=/tmp/issue16; mkdir -p $W
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, triton, transformers, gptqmodel, fla, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'gptqmodel', gptqmodel.__version__, 'fla', fla.__version__, 'numpy', numpy.__version__)" 2>/dev/null | tail -1
build() { python3 benchmarks/gpu_quantize.py --work $W --layers $1 --build-only; }
cold() { export TRITON_CACHE_DIR=$W/triton-$1 GPTQMODEL_GPTQ_BLOCK_BUILD_ROOT=$W/jit-$1; rm -rf "$TRITON_CACHE_DIR" "$GPTQMODEL_GPTQ_BLOCK_BUILD_ROOT"; }
bench() {  # NAME LAYERS PATH [extra args]
  local name=$1 layers=$2 path=$3; shift 3
  cold "$name"
  python3 benchmarks/gpu_quantize.py --work $W --layers "$layers" --path "$path" --json "$OUT/$name.json" \
    --log $W/$name.log "$@" | grep -v '^ \|^{\|^}'
  gzip -c $W/$name.log > "$OUT/$name.log.gz"
}
for MODE in "${MODES[@]}"; do
echo "== $MODE"
case $MODE in
  kernels)
    cold kernels
    python3 benchmarks/gpu_gla.py --lengths 2048 --batch 4 --dtypes fp32 --impls torch,fla-chunk \
      --json "$OUT/gla-b4.json"
    python3 benchmarks/gpu_hessian.py --json "$OUT/hessian.json"
    ;;
  pair)
    build 8
    bench soarpack-8 8 soarpack --hashes "$OUT/hashes-soarpack-8.json"
    bench gptqmodel-8 8 gptqmodel-default
    python3 - "$OUT" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/{n}-8.json")) for n in ("soarpack", "gptqmodel"))
print(f"gptq phase ratio {a['phases_s']['gptq'] / b['phases_s']['gptq']:.3f}  wall ratio {a['wall_s'] / b['wall_s']:.3f}"
      f"  (soarpack {a['wall_s']:.1f}s, GPTQModel defaults {b['wall_s']:.1f}s, both cold)")
PY
    ;;
  full)
    build 32
    bench soarpack-32-cap16 32 soarpack --cap-gib 16
    ;;
  same)
    build 8
    M=$(ls -d $W/sala-release-8L)
    for tree in old compat new warm; do
      src=$PWD; [ $tree = old ] && src=$PWD/.device/old
      if [ $tree = warm ]; then export TRITON_CACHE_DIR=$W/triton-same-new GPTQMODEL_GPTQ_BLOCK_BUILD_ROOT=$W/jit-same-new
      else cold same-$tree; fi
      t0=$SECONDS
      # compat: this tree with fla's GLA and GPTQModel's float32 Hessians, i.e. the old numerics; -P: soarpack
      # comes from $src, not from the working directory
      env $([ $tree = compat ] && echo SOARPACK_GLA_BACKEND=fla SOARPACK_FP32_HESSIAN=1) \
      PYTHONPATH=/tmp/site:$src python3 -P -m soarpack quantize "$M" $W/same-$tree \
        --recipe w4-full --rows 128 --max-len 2048 --max-sanity-loss 1000 --device cuda --no-report --force \
        --log $W/same-$tree.log > $W/same-$tree.stdout 2>&1 || { tail -20 $W/same-$tree.stdout; tail -40 $W/same-$tree.log; }
      echo "$tree tree: $((SECONDS - t0)) s, soarpack from $(PYTHONPATH=/tmp/site:$src python3 -P -c 'import soarpack; print(soarpack.__file__)')"
      gzip -c $W/same-$tree.log > "$OUT/same-$tree.log.gz"
    done
    for tree in old compat new warm; do grep -a "KL(original" $W/same-$tree.log | tail -1 | sed "s/^/$tree: /"; done
    python3 benchmarks/compare_checkpoints.py $W/same-old $W/same-compat --json "$OUT/same-old-compat.json"
    python3 benchmarks/compare_checkpoints.py $W/same-old $W/same-new --json "$OUT/same-old-new.json"
    python3 benchmarks/compare_checkpoints.py $W/same-new $W/same-warm --json "$OUT/same-new-warm.json"
    ;;
  *) echo "unknown mode $MODE"; exit 2;;
esac
done
