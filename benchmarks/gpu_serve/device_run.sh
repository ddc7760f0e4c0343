#!/usr/bin/env bash
# One device call of the plan in README.md: `bash benchmarks/gpu_serve/device_run.sh STAGE...` from the repo root,
# with `.whl` carried (fetch_wheels.py) and, for W4, the Marlin extension at $MARLIN_SO (default: the first
# .whl/*marlin*.so or .gpu/*marlin*.so). Stages, in order (each logs to $OUT/<stage>.log and stops the call on failure):
#   install   the carried wheels into /tmp/serve-site (--target: the device's own torch stays), the trimmed
#             sglang-kernel into it, the fork's python/ into /tmp/fork, .whl/jitcache.tgz (if carried) into ~
#   check     device_check.py: the shimmed closure imports for real; rope; Marlin through the fork's path
#   build     the 2-layer full-width random bf16 model and its w4-mlp copy (compare.py build / w4)
#   ref       soarpack's reference tokens for both (compare.py reference: the device's own torch; soarpack's pydantic
#             and tokenizers come from the carried site, transformers is not imported)
#   bf16 | w4 the fork's server on that checkpoint (launch.py), 3 prompts x 16 greedy tokens, the token table;
#             the server's first 200 log lines and the table land in $OUT
#   jitcache  FlashInfer's and Triton's JIT caches as one tgz in $OUT when <= 16 MiB (carry it next time)
set -uo pipefail
# The device tool brings back at most 8 files: every log goes to $W, and on exit the few results are copied to $OUT
# and the rest packed into $OUT/logs.tgz.
FINAL=${OUT:-/tmp/out}; W=/tmp/gs-run; rm -rf "$W"; mkdir -p "$W" "$FINAL"; OUT=$W
pack() {
  cp "$W"/run.log "$W"/check.json "$W"/table-*.md "$W"/jitcache.tgz "$FINAL"/ 2>/dev/null
  tar -czf "$FINAL/logs.tgz" -C "$W" --exclude jitcache.tgz . 2>/dev/null
}
trap pack EXIT
trap 'exit 143' TERM
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
GS=benchmarks/gpu_serve; SITE=/tmp/serve-site; FORK=/tmp/fork/python; M=/tmp/models; PORT=${PORT:-30000}
# The 2-layer model has the release vocabulary (73448) and the tiny 512-token tokenizer: ids go in and come out as
# ids (compare.py query sends input_ids), so the server skips its tokenizer and detokenizer. SERVE_EXTRA= keeps them.
SERVE_EXTRA=${SERVE_EXTRA---skip-tokenizer-init}
MARLIN_SO=${MARLIN_SO:-$(ls .whl/*marlin*.so .gpu/*marlin*.so 2>/dev/null | head -1)}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/run.log"; }
server_path() { echo "$ROOT/$GS/shim:$FORK:$SITE:$ROOT"; }

stage_install() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl &&
  tar -xzf .whl/sglang-kernel-0.4.5-sm90.tar.gz -C "$SITE" &&
  mkdir -p /tmp/fork && tar -xzf .whl/d29fb130c-python.tar.gz -C /tmp/fork &&
  { [ ! -f .whl/jitcache.tgz ] || tar -xzf .whl/jitcache.tgz -C ~; } &&
  du -sh "$SITE" /tmp/fork
}
stage_check() {
  PYTHONPATH=$(server_path) SOARPACK_MARLIN_SO=${MARLIN_SO:+$ROOT/$MARLIN_SO} \
    python3 $GS/device_check.py --out "$OUT/check.json"
}
stage_build() {
  PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py build --out $M/bf16 --device cuda &&
  PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py w4 --src $M/bf16 --out $M/w4
}
stage_ref() {
  for v in bf16 w4; do
    PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py reference --ckpt $M/$v --out "$OUT/ref-$v.json" --device cuda || return 1
  done
}
serve_and_compare() {  # $1: bf16 | w4
  local v=$1 need=16 flags=(--bf16)
  if [ "$v" = w4 ]; then need=15; flags=(--marlin-so "$ROOT/$MARLIN_SO"); fi
  # Its own process group (setsid), so the scheduler and detokenizer it spawns are stopped with it.
  setsid python3 $GS/launch.py --model-path $M/$v --port $PORT --fork-src $FORK --site $SITE "${flags[@]}" \
    -- $SERVE_EXTRA > "$OUT/server-$v.log" 2>&1 &
  local pid=$!
  PYTHONPATH=$SITE python3 $GS/compare.py query --ckpt $M/$v --url http://127.0.0.1:$PORT --wait ${WAIT_S:-420} \
    --pid $pid --out "$OUT/served-$v.json"; local rc=$?
  kill -TERM -- -"$pid" 2>/dev/null; sleep 5; kill -KILL -- -"$pid" 2>/dev/null
  head -200 "$OUT/server-$v.log" > "$OUT/server-$v.head.log"
  tail -60 "$OUT/server-$v.log" > "$OUT/server-$v.tail.log"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | sed 's/^/gpu memory after stop: /'
  [ $rc -eq 0 ] || { echo "--- the server's last lines:"; tail -40 "$OUT/server-$v.log"; return $rc; }
  # The server is stopped: the reference fed the served tokens (compare.py reference --follow) has the GPU to itself.
  PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py reference --ckpt $M/$v --follow "$OUT/served-$v.json" \
    --out "$OUT/followed-$v.json" --device cuda || return 1
  python3 $GS/compare.py table --ref "$OUT/ref-$v.json" --served "$OUT/served-$v.json" \
    --followed "$OUT/followed-$v.json" --need $need | tee "$OUT/table-$v.md"
}
stage_bf16() { serve_and_compare bf16; }
stage_w4() { [ -n "$MARLIN_SO" ] || { echo "no Marlin extension (MARLIN_SO)"; return 2; }; serve_and_compare w4; }
stage_jitcache() {
  tar -czf "$OUT/jitcache.tgz" -C ~ .cache/flashinfer .triton 2>/dev/null
  local size; size=$(stat -c %s "$OUT/jitcache.tgz" 2>/dev/null || echo 0)
  [ "$size" -le $((16 * 1024 * 1024)) ] || { rm -f "$OUT/jitcache.tgz"; echo "jit cache $size bytes: over 16 MiB, not kept"; }
}

for stage in "$@"; do
  log "stage $stage"
  t0=$(date +%s)
  "stage_$stage" > >(tee "$OUT/$stage.log") 2>&1; rc=$?
  log "stage $stage rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -eq 0 ] || { log "stopping: stage $stage failed (its log: \$OUT/$stage.log)"; exit $rc; }
done
