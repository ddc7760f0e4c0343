#!/usr/bin/env bash
# Issue 16's GPU measurements in one device call each (each fits 9.5 minutes on one H200 with 16 cores):
#
#   bash benchmarks/gpu_issue16.sh pair   # 8 layers: soarpack vs GPTQModel's defaults, both cold (fresh Triton and
#                                         # JIT caches each), same model, same 256 rows        (~5-6 min)
#   bash benchmarks/gpu_issue16.sh full   # 32 layers, soarpack, torch's allocator capped at 16 GiB, cold (~7-8 min)
#   bash benchmarks/gpu_issue16.sh same   # 8 layers through `soarpack quantize` with the pre-change tree
#                                         # (.device/old, carried) and this one: sha256 of every tensor compared
#
# Carry `.whl` (and `.device/old` for `same`). Results land in $OUT (JSON, gzipped logs, this script's output).
set -o pipefail
MODE=${1:?pair, full or same}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run-$MODE.txt") 2>&1
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
case $MODE in
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
    for tree in old new; do
      src=$PWD; [ $tree = old ] && src=$PWD/.device/old
      cold same-$tree
      t0=$SECONDS
      PYTHONPATH=/tmp/site:$src python3 -m soarpack quantize "$M" $W/same-$tree \
        --recipe w4-full --rows 256 --max-len 2048 --max-sanity-loss 1000 --device cuda --no-report --force \
        --log $W/same-$tree.log > $W/same-$tree.stdout 2>&1 || { tail -20 $W/same-$tree.stdout; tail -40 $W/same-$tree.log; }
      echo "$tree tree: $((SECONDS - t0)) s"
      gzip -c $W/same-$tree.log > "$OUT/same-$tree.log.gz"
    done
    python3 - $W "$OUT" <<'PY'
import json, sys
sys.path.insert(0, ".")
from benchmarks.gpu_quantize import tensor_hashes
w, out = sys.argv[1:]
old, new = tensor_hashes(f"{w}/same-old"), tensor_hashes(f"{w}/same-new")
differ = sorted(n for n in old.keys() | new.keys() if old.get(n) != new.get(n))
json.dump({"tensors": len(new), "differ": differ, "old": old, "new": new}, open(f"{out}/same.json", "w"), indent=1)
print(f"{len(new)} tensors, {len(differ)} differ between the pre-change tree and this one: {differ[:5]}")
PY
    ;;
  *) echo "unknown mode $MODE"; exit 2;;
esac
