# Shared by device_run.sh and ruler_lease.sh (sourced, never run): the paths of a device call, the server's start
# and stop, the carried wheels' install and the model build. The caller sets OUT (where logs go) before sourcing.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# GS_WORK holds the carried site, the fork, the models and the patched trees: /tmp on the device; a CPU rehearsal
# (tests/test_ruler_lease.py) points it at a folder of its own, and FORK at an extracted fork tree.
GS_WORK=${GS_WORK:-/tmp}
GS=benchmarks/gpu_serve; SITE=$GS_WORK/serve-site; FORK=${FORK:-$GS_WORK/fork/python}; M=$GS_WORK/models
PORT=${PORT:-30000}
SP="python3 -m soarpack"  # soarpack's CLI under the device's Python: PYTHONPATH=$ROOT:$SITE (typer, rich, httpx there)
LAYERS=${LAYERS:-2}
MARLIN_SO=${MARLIN_SO:-$(cd "$ROOT" && ls .whl/*marlin*.so .gpu/*marlin*.so 2>/dev/null | head -1)}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/run.log"; }
port_busy() { python3 -c "import socket, sys; socket.create_connection(('127.0.0.1', $PORT), 2)" 2>/dev/null; }
server_path() { echo "$ROOT/$GS/shim:$FORK:$SITE:$ROOT"; }
# What starts a server: launch.py (the fork's real server); a CPU rehearsal of these scripts points it at a stand-in.
LAUNCH=${LAUNCH:-$ROOT/$GS/launch.py}

# The server (launch.py) in its own process group (setsid), so the scheduler and detokenizer it spawns are stopped
# with it; SERVER_PGID lets the caller stop it too when a call is cut short. A server still answering on the port (one
# an earlier call left) would be measured instead of this one: refused.
SERVER_ENV_ADD=()  # NAME=VALUE pairs the next server_up gives the server (a patch's switch), none by default
server_up() {  # $1 log, $2 checkpoint, $3 fork tree, $4 extra server flags (split at spaces), then launch.py's flags
  local log=$1 ckpt=$2 fork=$3 extra=$4; shift 4
  ! port_busy || { echo "something already listens on port $PORT: stop it first"; return 2; }
  env ${SERVER_ENV_ADD[@]+"${SERVER_ENV_ADD[@]}"} setsid python3 "$LAUNCH" --model-path "$ckpt" --port $PORT \
    --fork-src "$fork" --site $SITE "$@" -- $extra > "$log" 2>&1 &
  SERVER_PGID=$!
}
server_down() {
  [ -n "${SERVER_PGID:-}" ] || return 0
  kill -TERM -- -"$SERVER_PGID" 2>/dev/null
  local i; for i in $(seq 20); do kill -0 -- -"$SERVER_PGID" 2>/dev/null || break; sleep 0.5; done  # gone: no wait
  kill -KILL -- -"$SERVER_PGID" 2>/dev/null; SERVER_PGID=
}
server_wait() {  # until /health answers, or the server's process has died
  python3 "$ROOT/$GS/compare.py" wait --url http://127.0.0.1:$PORT --wait "${WAIT_S:-420}" --pid "$SERVER_PGID"
}

install_carried() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$ROOT"/.whl/*.whl &&
  tar -xzf "$ROOT/.whl/sglang-kernel-0.4.5-sm90.tar.gz" -C "$SITE" &&
  mkdir -p $GS_WORK/fork && tar -xzf "$ROOT/.whl/d29fb130c-python.tar.gz" -C $GS_WORK/fork &&
  { [ ! -f "$ROOT/.whl/jitcache.tgz" ] || tar -xzf "$ROOT/.whl/jitcache.tgz" -C ~; } &&
  du -sh "$SITE" $GS_WORK/fork
}
# The $LAYERS-layer full-width random bf16 model and its w4-mlp copy ($1 = bf16: the bf16 model alone, for a plan that
# serves no W4: the copy's quantization and 9 GB write are device time); skipped when this machine built them already.
build_models() {
  local done=$M/built-$LAYERS${1:+-$1}
  if [ -f $M/built-$LAYERS ] || [ -f $done ]; then echo "built earlier on this machine: $LAYERS layers in $M"; du -sh $M/*; return 0; fi
  rm -rf $M
  (cd "$ROOT" && PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py build --out $M/bf16 --layers "$LAYERS" --device cuda &&
   { [ "${1:-}" = bf16 ] || PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py w4 --src $M/bf16 --out $M/w4 --device cuda; }) &&
  touch $done && du -sh $M/*
}
# One more quantized copy of the bf16 model under $M/$1, by recipe $2 (compare.py w4); skipped when it is there.
build_copy() {
  [ ! -f $M/$1/config.json ] || { echo "built earlier on this machine: $M/$1"; return 0; }
  (cd "$ROOT" && PYTHONPATH=$ROOT:$SITE python3 $GS/compare.py w4 --src $M/bf16 --out $M/$1 --recipe "$2" --device cuda) &&
  du -sh $M/$1
}
# The fork with some of soarpack's patches, made once per machine and patch list, beside the unpatched one.
fork_with() {  # $1 the tree's name under $GS_WORK, then the patches; prints the patched tree's python/ folder
  local out=$GS_WORK/$1/python name=$1 flags=(); shift
  for p in "$@"; do flags+=(--patch "$p"); done
  [ -d $out ] || (cd "$ROOT" && PYTHONPATH=$ROOT python3 -m soarpack.serve.patches apply --src $FORK --out $out \
    "${flags[@]}" > "$OUT/patch-$name.json") || return 1
  echo $out
}
patched_fork() { fork_with fork-d w4-dispatch; }  # profile "fast"
fork_f8() { fork_with fork-f8 w4-dispatch fp8-prefill; }  # patches 04 + 05 (issue 37)
fork_gla() { fork_with fork-gla w4-dispatch gla-decode-in-place; }  # "fast" + patch 06 (issue 38)
fork_g() { fork_with fork-g gla-decode-in-place; }  # patch 06 alone (bf16 with and without it)
