#!/usr/bin/env bash
# One device call of the plan in README.md: `bash benchmarks/gpu_serve/device_run.sh STAGE...` from the repo root
# (under `timeout -s TERM N` to end inside the call's limit: the results then still come back),
# with `.whl` carried (fetch_wheels.py) and, for W4, the Marlin extension at $MARLIN_SO (default: the first
# .whl/*marlin*.so or .gpu/*marlin*.so). Stages, in order (each logs to $OUT/<stage>.log and stops the call on failure):
#   install   the carried wheels into /tmp/serve-site (--target: the device's own torch stays), the trimmed
#             sglang-kernel into it, the fork's python/ into /tmp/fork, .whl/jitcache.tgz (if carried) into ~
#   check     device_check.py: the shimmed closure imports for real; rope; Marlin through the fork's path
#   build     the $LAYERS-layer (default 2) full-width random bf16 model and its w4-mlp copy (compare.py build / w4);
#             skipped when this machine built the same already (a warm machine keeps /tmp between calls)
#   ref       soarpack's reference tokens for both (compare.py reference: the device's own torch; soarpack's pydantic
#             and tokenizers come from the carried site, transformers is not imported)
#   bf16 | w4 the fork's server on that checkpoint (launch.py), 3 prompts x 16 greedy tokens, the token table;
#             the server's first 200 log lines and the table land in $OUT
#   fp8 | w4f8 (issue 37) the same for the fork's own --quantization fp8 on the bf16 checkpoint (against the bf16
#             reference), and for the w4 checkpoint on the fork with patches 04 + 05 with SOARPACK_FP8_PREFILL=$F8_COMPARE
#             (default 1: every call through FP8, since these prompts are shorter than any prefill threshold); the
#             followed-token counts are reported against need $NEED_F8 (default 0: no bar set)
#   speedset  `soarpack speedset` on the bf16 model's tokenizer with the 1of16 preset (or $SPEED_MIX: a preset or a
#             mix file, e.g. benchmarks/gpu_serve/speed-mix-long.toml for issue 37's long prompts), $BENCH_ROWS rows
#   bench-bf16 | bench-w4 | bench-w4d | bench-fp8 | bench-w4f8
#             the server (w4d: the fork with soarpack's w4-dispatch patch; fp8: the bf16 checkpoint with the fork's
#             --quantization fp8; w4f8: the fork with patches 04 + 05) with the tokenizer on, `soarpack bench`
#             S1 and S8 on the speed set, the server stopped; bench-<v>.json in $OUT
#   rehearse  `soarpack rehearse-server` on the w4 checkpoint with dense-bf16.toml, a synthetic public-format slice
#             (public_slice.py) and --max-tokens $REHEARSE_MAX_TOKENS; rehearsal.json in $OUT, whatever its verdict
#   jitcache  FlashInfer's and Triton's JIT caches as one tgz in $OUT when <= 16 MiB (carry it next time)
set -uo pipefail
# The device tool brings back at most 8 files: every log goes to $W, and on exit the few results are copied to $OUT
# and the rest packed into $OUT/logs.tgz.
FINAL=${OUT:-/tmp/out}; W=/tmp/gs-run; rm -rf "$W"; mkdir -p "$W" "$FINAL"; OUT=$W
pack() {
  # A server left by a stage cut short (the call's own `timeout`) would hold the GPU and the port for the next call.
  [ -z "${SERVER_PGID:-}" ] || kill -KILL -- -"$SERVER_PGID" 2>/dev/null
  cp "$W"/run.log "$W"/check.json "$W"/table-*.md "$W"/bench-*.json "$W"/rehearsal.json "$W"/jitcache.tgz "$FINAL"/ 2>/dev/null
  tar -czf "$FINAL/logs.tgz" -C "$W" --exclude jitcache.tgz . 2>/dev/null
}
trap pack EXIT
# On TERM (the call's `timeout`) pack runs from this trap itself: an `exit` here, inside a stage whose output goes to
# a killed tee, ended bash before the EXIT trap ran (seen on the device: a whole call came back with no file).
trap 'exec >>"$W/run.log" 2>&1; trap - EXIT; pack; exit 143' TERM
. "$(dirname "$0")/lib.sh"; cd "$ROOT"
# The 2-layer model has the release vocabulary (73448) and the tiny 512-token tokenizer: ids go in and come out as
# ids (compare.py query sends input_ids), so the server skips its tokenizer and detokenizer. SERVE_EXTRA= keeps them.
SERVE_EXTRA=${SERVE_EXTRA---skip-tokenizer-init}
BENCH_ROWS=${BENCH_ROWS:-16}; REHEARSE_MAX_TOKENS=${REHEARSE_MAX_TOKENS:-32}
# The benches time S1 and S8 only: CUDA graphs up to bs 8 cover both and capture in less time than the profile's 32.
BENCH_EXTRA=${BENCH_EXTRA---cuda-graph-max-bs 8}

stage_install() { install_carried; }
stage_check() {
  PYTHONPATH=$(server_path) SOARPACK_MARLIN_SO=${MARLIN_SO:+$ROOT/$MARLIN_SO} \
    python3 $GS/device_check.py --out "$OUT/check.json"
}
stage_build() { build_models; }
stage_ref() {
  for v in bf16 w4; do
    PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py reference --ckpt $M/$v --out "$OUT/ref-$v.json" --device cuda || return 1
  done
}
serve_and_compare() {  # $1: bf16 | w4 | fp8 | w4f8
  local v=$1 need=16 flags=(--bf16) ckpt=$M/$1 fork=$FORK extra=$SERVE_EXTRA ref=$1
  if [ "$v" = w4 ]; then need=15; flags=(--marlin-so "$ROOT/$MARLIN_SO"); fi
  if [ "$v" = fp8 ]; then need=${NEED_F8:-0}; ckpt=$M/bf16; ref=bf16; extra="$SERVE_EXTRA --quantization fp8"; fi
  if [ "$v" = w4f8 ]; then
    need=${NEED_F8:-0}; ckpt=$M/w4; ref=w4; flags=(--marlin-so "$ROOT/$MARLIN_SO"); fork=$(fork_f8) || return 1
    export SOARPACK_FP8_PREFILL=${F8_COMPARE:-1}  # read by the server's processes at import
  fi
  server_up "$OUT/server-$v.log" $ckpt $fork "$extra" "${flags[@]}"; local up=$?
  [ "$v" != w4f8 ] || unset SOARPACK_FP8_PREFILL
  [ $up -eq 0 ] || return $up
  PYTHONPATH=$SITE python3 $GS/compare.py query --ckpt $ckpt --url http://127.0.0.1:$PORT --wait ${WAIT_S:-420} \
    --pid $SERVER_PGID --out "$OUT/served-$v.json"; local rc=$?
  server_down
  head -200 "$OUT/server-$v.log" > "$OUT/server-$v.head.log"
  tail -60 "$OUT/server-$v.log" > "$OUT/server-$v.tail.log"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | sed 's/^/gpu memory after stop: /'
  [ $rc -eq 0 ] || { echo "--- the server's last lines:"; tail -40 "$OUT/server-$v.log"; return $rc; }
  grep -E "soarpack fp8-prefill|KV Cache is allocated|Load weight end" "$OUT/server-$v.log" | head -5
  # The server is stopped: the reference fed the served tokens (compare.py reference --follow) has the GPU to itself.
  PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py reference --ckpt $ckpt --follow "$OUT/served-$v.json" \
    --out "$OUT/followed-$v.json" --device cuda || return 1
  python3 $GS/compare.py table --ref "$OUT/ref-$ref.json" --served "$OUT/served-$v.json" \
    --followed "$OUT/followed-$v.json" --need $need | tee "$OUT/table-$v.md"
}
stage_bf16() { serve_and_compare bf16; }
stage_w4() { [ -n "$MARLIN_SO" ] || { echo "no Marlin extension (MARLIN_SO)"; return 2; }; serve_and_compare w4; }
stage_fp8() { serve_and_compare fp8; }
stage_w4f8() { [ -n "$MARLIN_SO" ] || { echo "no Marlin extension (MARLIN_SO)"; return 2; }; serve_and_compare w4f8; }
stage_speedset() {
  PYTHONPATH=$ROOT:$SITE $SP speedset --model-dir $M/bf16 -n "$BENCH_ROWS" --mix "${SPEED_MIX:-1of16}" \
    -o "$OUT/speed.jsonl" --force --json
}
serve_and_bench() {  # $1: bf16 | w4 | w4d | w4full | fp8 | w4f8
  local v=$1 fork=$FORK ckpt=$M/w4 flags=(--marlin-so "$ROOT/$MARLIN_SO") quant=
  if [ "$v" = bf16 ]; then ckpt=$M/bf16; flags=(--bf16); fi
  if [ "$v" = fp8 ]; then ckpt=$M/bf16; flags=(--bf16); quant=" --quantization fp8"; fi
  if [ "$v" = w4f8 ]; then fork=$(fork_f8) || return 1; fi
  if [ "$v" = w4full ]; then
    ckpt=$M/w4full
    [ -f $ckpt/config.json ] || PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py w4 --src $M/bf16 --out $ckpt --recipe w4-full \
      --device cuda || return 1
  fi
  if [ "$v" = w4d ]; then fork=$(patched_fork) || return 1; fi
  [ -f "$OUT/speed.jsonl" ] || { echo "no speed set: run the speedset stage first"; return 2; }
  server_up "$OUT/server-$v.log" $ckpt $fork "$BENCH_EXTRA$quant" "${flags[@]}" || return $?
  local rc=0
  server_wait || rc=$?
  if [ $rc -eq 0 ]; then
    PYTHONPATH=$ROOT:$SITE $SP bench --api-base http://127.0.0.1:$PORT --model-dir $ckpt --s1 "$OUT/speed.jsonl" \
      --s8 "$OUT/speed.jsonl" -o "$OUT/bench-$v.json" --label "$v, $LAYERS layers, dense-bf16 profile${BENCH_EXTRA:+ + $BENCH_EXTRA}" \
      || rc=$?
  fi
  server_down
  grep -E "Load weight end|Capture cuda graph end|KV Cache is allocated|max_total_num_tokens|w4-dispatch|gptq_marlin|fp8-prefill" \
    "$OUT/server-$v.log" | head -20
  [ $rc -eq 0 ] || { echo "--- the server's last lines:"; tail -40 "$OUT/server-$v.log"; }
  return $rc
}
stage_bench-bf16() { serve_and_bench bf16; }
stage_bench-w4() { serve_and_bench w4; }
stage_bench-w4d() { serve_and_bench w4d; }
stage_bench-w4full() { serve_and_bench w4full; }
stage_bench-fp8() { serve_and_bench fp8; }
stage_bench-w4f8() { serve_and_bench w4f8; }
stage_rehearse() {
  python3 $GS/launch.py --write-python /tmp/serve-python --fork-src $FORK --site $SITE --marlin-so "$ROOT/$MARLIN_SO" &&
  python3 $GS/public_slice.py --out "$OUT/public-slice.jsonl" || return 1
  local rc=0
  PYTHONPATH=$ROOT:$SITE $SP rehearse-server $M/w4 --data "$OUT/public-slice.jsonl" --profile $GS/dense-bf16.toml \
    --python /tmp/serve-python -o "$OUT/rehearsal" --port $PORT --per-task 2 --bench-rows 8 \
    --max-tokens "$REHEARSE_MAX_TOKENS" --ready-timeout ${WAIT_S:-420} --json > "$OUT/rehearsal.json" || rc=$?
  head -c 6000 "$OUT/rehearsal.json"; echo
  echo "rehearse-server exit code $rc (1 is its verdict on random weights: C < 1; anything else is a failure)"
  [ $rc -le 1 ] && [ -s "$OUT/rehearsal.json" ]
}
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
