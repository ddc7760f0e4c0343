#!/usr/bin/env bash
# Issue 36's served table in one H200 lease: the fork's real server (dense variant, README.md here), each profile
# timed at S1, S8 and Smax on two speed sets by `soarpack bench` and by the organisers' own bench_serving.sh (the
# fork's sglang.bench_serving) on the same server. The run outlives one device call (10 minutes at most): `start`
# launches it in a session of its own, later calls `wait` on it; every call brings back what it has so far.
#
#   bash benchmarks/gpu_serve/ruler_lease.sh start [S]   launch the run (BUDGET_S bounds it), wait up to S seconds, collect
#   bash benchmarks/gpu_serve/ruler_lease.sh wait S      wait until it is done or S seconds passed, collect; with
#                                                        BUDGET_LEFT_S (the session's device time left, from the last
#                                                        call's reply) the gate's budget becomes what is really left
#   bash benchmarks/gpu_serve/ruler_lease.sh collect     copy what it has into $OUT (at most 8 files)
#   bash benchmarks/gpu_serve/ruler_lease.sh estimate    here, before a lease: what PLAN costs and what the gate would skip
#   bash benchmarks/gpu_serve/ruler_lease.sh again RUN [S]  once the run is done (waits up to S s for it): one more
#                                                        server RUN with its sets and tiers, then collect
#
# Carried in .whl (not committed): fetch_wheels.py's wheels, the fork's Marlin sources
# (marlin-src-d29fb130c.tar.gz: `git archive d29fb130c sgl-kernel/csrc/gemm/marlin sgl-kernel/include` of
# tc-mb/sglang) and the organisers' script (organisers-bench_serving.sh, SOAR-Toolkit 2ed4ade, byte for byte).
#
# The plan (`run`), every step logged with its time in $R/run.log:
#   1. the carried wheels installed; the fork's Marlin built in the background (nice, 12 of the 16 cores:
#      benchmarks/build_marlin_ext.py), overlapping the model build and the first (bf16) server's start and benches;
#   2. the $LAYERS-layer full-width random bf16 model and its w4-mlp copy (compare.py build, w4), and when PLAN has
#      fast-fp8 its w4-mlp-w8-attn copy (w4a8);
#   3. the speed sets of SETS, with `soarpack speedset` on that model's tokenizer: 1of16 x ROWS_SHORT, long-128k x
#      ROWS_LONG, long-32k (speed-mix-long.toml, issue 37's: inputs 32K-128K) x ROWS_LONG32; their sha256 in
#      $R/sets.json; pre-warm files: one row (their longest prompt), and each set's first 8 rows cut to
#      PREWARM_CHARS characters (prewarm-SET.jsonl), 8 tokens out;
#   4. GLA=first: issue 38's GPU check of patch 06 (benchmarks/gpu_gla_decode.py) while Marlin still builds;
#   5. servers, one after another, each fresh, in PLAN's order: bf16-first, then any of fast (w4-mlp + patch
#      w4-dispatch), fast-gla (fast + patch gla-decode-in-place), fast-gla-off (fast-gla's tree with patch 06 switched
#      off: SOARPACK_GLA_DECODE=fork), bf16-gla (bf16 on the fork with patch 06 alone),
#      fast-fp8 (w4-mlp-w8-attn + patches w4-dispatch and fp8-prefill), fp8 (the bf16 checkpoint, the fork's
#      --quantization fp8), safe (w4-mlp, no patch), each only if it and the last bf16 still fit in BUDGET_S (by
#      run_cost's estimates, scaled by what the first bf16 server took against its own; `estimate` prints them for a
#      PLAN before the lease), and bf16-last always; Marlin is built only when a run serves W4. A run named
#      NAME-first or NAME-last is profile NAME again (a baseline run before and after what it is compared with). On
#      each server: the pre-warm (untimed: the longest prompt alone, then each set's prewarm-SET.jsonl at once when TIERS has S8 or Smax), then per set of SETS
#      both clients at each tier of TIERS (FIRST_CLIENT first), their order alternating between the sets;
#   6. GLA=last: the same check after the table, if it fits.
#
# Rehearsed on a CPU by tests/test_ruler_lease.py (run, collect, again): REHEARSAL=1 (no install, no Marlin build,
# stand-ins for the organisers' client), GS_WORK (a folder instead of /tmp), FORK (an extracted fork tree), ORGS_SCRIPT
# (the organisers' script where it lies), LAUNCH (a stand-in server). Unset, each is what the device uses.
set -uo pipefail
GS_WORK=${GS_WORK:-/tmp}  # lib.sh: where the run's files go (a CPU rehearsal: a folder of its own)
R=$GS_WORK/ruler; mkdir -p "$R"; OUT_FINAL=${OUT:-/tmp/out}; OUT=$R; LAYERS=${LAYERS:-32}
. "$(dirname "$0")/lib.sh"; cd "$ROOT"
ROWS_SHORT=${ROWS_SHORT:-8}; ROWS_LONG=${ROWS_LONG:-6}; ROWS_LONG32=${ROWS_LONG32:-10}; BUDGET_S=${BUDGET_S:-1400}
PREWARM_CHARS=${PREWARM_CHARS:-16000}  # the S8 pre-warm's prompts: each set's first 8 rows cut to this many characters
# The runs (bf16-first and bf16-last always, the others in this order as the budget allows), the speed sets, and
# when patch 06's kernel check runs (first: before the servers; last: after them if it fits; off).
PLAN=${PLAN:-bf16-first fast safe bf16-last}; SETS=${SETS:-long-128k 1of16}; GLA=${GLA:-last}
# The tiers each client times (a set of at most 8 rows dispatches Smax as S8: every row at once).
TIERS=${TIERS:-S1 S8 Smax}
# Graphs up to bs 16 cover every batch of these sets (at most max(ROWS) requests run at once).
SERVE_EXTRA=${SERVE_EXTRA:---cuda-graph-max-bs 16}
STANDIN=$R/standin  # `datasets` for bench_serving's module-level import (the custom loader never calls it)
MARLIN_ABS=""  # the device-built Marlin extension, once its background build is done
FIRST_CLIENT=${FIRST_CLIENT:-ours}  # which client runs first on each server's first set: ours (soarpack bench) or organisers
# The tree the bf16 runs are served on: fork (the unpatched fork, the default) or fork-gla (patches 04 + 06 with 06
# switched off: for bf16 that runs the fork's own code, and a lease whose other runs are on fork-gla then pays one
# tree's first compilation, not two: about 115 s). With fork-gla, bf16-gla is served there too, 06 switched on: bf16
# with and without patch 06 then differ by the switch alone.
BF16_TREE=${BF16_TREE:-fork}
ORGS_SCRIPT=${ORGS_SCRIPT:-$ROOT/.whl/organisers-bench_serving.sh}  # the organisers' bench_serving.sh, byte for byte

elapsed() { echo $(( $(date +%s) - $(cat $R/t0) )); }
# The gate's bound, in seconds of the run: BUDGET_S, until a `wait` call with BUDGET_LEFT_S (the session's device time
# left, which only a call's reply tells: the machine's start is not known before the lease) sets it to the run's
# elapsed time plus that, less BUDGET_MARGIN_S for the last call's collect and transfer.
budget() { cat $R/budget 2>/dev/null || echo $BUDGET_S; }
set_budget() {  # one reading of the clock: the logged "gone" is the one the budget was computed from
  local gone=$(elapsed)
  echo $(( gone + $1 - ${BUDGET_MARGIN_S:-45} )) > $R/budget.tmp && mv $R/budget.tmp $R/budget
  log "budget: $(budget) s of the run ($gone s gone, $1 s of device time left, ${BUDGET_MARGIN_S:-45} s kept back)"
}

marlin_build() {
  # A carried extension (.whl/*marlin*.so: a lease's collect brings the one it built back) that loads under this
  # torch saves the 140-210 s build, and the CPU load it puts under the first bf16 server's timings.
  local so=$MARLIN_SO; [ -z "$so" ] || [[ $so == /* ]] || so=$ROOT/$so
  if [ -n "$so" ] && PYTHONPATH=$SITE python3 -c "import sys, torch; torch.ops.load_library(sys.argv[1])" "$so"; then
    mkdir -p $GS_WORK/mb && cp "$so" $GS_WORK/mb/ && echo "carried $so loads: no build"; return 0
  fi
  [ -z "$so" ] || echo "carried $so does not load here: building"
  mkdir -p $GS_WORK/marlin-src && tar -xzf .whl/marlin-src-d29fb130c.tar.gz -C $GS_WORK/marlin-src &&
  nice -n 19 python3 benchmarks/build_marlin_ext.py --src $GS_WORK/marlin-src/sgl-kernel --build $GS_WORK/mb --jobs 12
}

marlin_so() { ls $GS_WORK/mb/*.so 2>/dev/null | head -1; }  # the built extension, if any (run, and again after it)

# REHEARSAL=1 only (tests/test_ruler_lease.py, on a CPU): the fork's package root imports its server stack, which a CPU
# machine lacks, so the organisers' client gets a stand-in root whose __path__ is the fork's sglang/ (bench_serving is
# still the fork's own file, as in tests/test_bench_conformance.py), and pybase64 (images only) where python3 lacks it.
rehearsal_standins() {
  mkdir -p "$STANDIN/sglang"
  python3 -c 'import sys; print("__path__.append(%r)" % sys.argv[1])' "$FORK/sglang" > "$STANDIN/sglang/__init__.py"
  python3 -c "import pybase64" 2>/dev/null || echo "from base64 import b64decode, b64encode" > "$STANDIN/pybase64.py"
}

make_sets() {
  local rc=0 set rows mix
  for set in $SETS; do
    mix=$set
    case $set in
      1of16) rows=$ROWS_SHORT ;; long-128k) rows=$ROWS_LONG ;;
      long-32k) rows=$ROWS_LONG32; mix=$ROOT/$GS/speed-mix-long.toml ;;  # issue 37's set: inputs 32K-128K
      *) log "no such speed set: $set"; return 1 ;;
    esac
    PYTHONPATH=$ROOT:$SITE $SP speedset --model-dir $M/bf16 -n "$rows" --mix $mix -o $R/speed-$set.jsonl \
      --force --json > $R/speedset-$set.json || rc=1
  done
  PREWARM_CHARS=$PREWARM_CHARS python3 - "$R" $SETS <<'EOF' || rc=1
import hashlib, json, os, sys
from pathlib import Path
r = Path(sys.argv[1])
sets = {}
for name in sys.argv[2:]:
    summary = json.loads((r / f"speedset-{name}.json").read_text())
    sets[name] = {"file": f"speed-{name}.jsonl", "sha256": hashlib.sha256((r / f"speed-{name}.jsonl").read_bytes()).hexdigest(),
                  "rows": summary["rows"], "histogram": summary["histogram"], "mix": summary["mix"]}
rows = [json.loads(line) for name in sys.argv[2:] for line in (r / f"speed-{name}.jsonl").read_text().splitlines()]
longest = max(rows, key=lambda row: len(row["question"]))
EIGHT = "one two three four five six seven eight"  # about 8 tokens out: a pre-warm times no decode
(r / "prewarm.jsonl").write_text(json.dumps({"question": longest["question"], "model_response": EIGHT}) + "\n")
# Each set's first 8 rows at once, each cut to PREWARM_CHARS characters (16,000: a few thousand tokens): the server's
# first batch of many prompts is then not a timed one, at a few seconds' cost even on long-32k (whole rows: ~50 s).
cut = int(os.environ["PREWARM_CHARS"])
for name in sys.argv[2:]:
    rows8 = [json.loads(line) for line in (r / f"speed-{name}.jsonl").read_text().splitlines()[:8]]
    cut_rows = ({**row, "question": row["question"][:cut], "model_response": EIGHT} for row in rows8)
    (r / f"prewarm-{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in cut_rows))
(r / "sets.json").write_text(json.dumps(sets, indent=1))
print(json.dumps(sets, indent=1))
EOF
  return $rc
}

organisers() {  # $1 label, $2 speed set: bench_serving.sh at TIERS on the running server, as the platform runs it
  local label=$1 set=$2 work=$R/orgs-$1 tier tiers=()
  mkdir -p "$work" "$STANDIN"
  [ -f "$STANDIN/datasets.py" ] || printf 'def load_dataset(*a, **k):\n    raise RuntimeError("datasets stand-in")\n' > "$STANDIN/datasets.py"
  [ -z "${REHEARSAL:-}" ] || rehearsal_standins
  for tier in $TIERS; do tiers+=("SPEED_DATA_${tier^^}=$set"); done  # the script skips a tier whose variable is unset
  (cd "$work" && env PYTHONPATH=$STANDIN:$(server_path) "${tiers[@]}" \
     timeout 900 bash "$ORGS_SCRIPT" http://127.0.0.1:$PORT) > "$R/orgs-$label.log" 2>&1
  local rc=$?
  # The script itself exits 0 when bench_serving fails (`|| true`) and reports 0 s: a zero is a failure here.
  tail -1 "$R/orgs-$label.log" | python3 -c "import json, sys; d = json.loads(sys.stdin.read()); sys.exit(0 if all(d[t] > 0 for t in sys.argv[1:]) else 1)" $TIERS || rc=1
  tail -1 "$R/orgs-$label.log"
  return $rc
}

ours() {  # $1 label, $2 speed set, $3 checkpoint
  local tier tiers=()
  for tier in $TIERS; do tiers+=("--${tier,,}" "$2"); done
  PYTHONPATH=$ROOT:$SITE timeout 900 $SP bench --api-base http://127.0.0.1:$PORT --model-dir "$3" --trust-remote-code \
    "${tiers[@]}" -o "$R/bench-$1.json" --label "$1" > "$R/ours-$1.log" 2>&1
  local rc=$?
  tail -3 "$R/ours-$1.log"
  return $rc
}

untimed() {  # $1 checkpoint, $2 --s1|--s8, $3 pre-warm file, $4 result JSON: soarpack bench, no warm-up, no settle
  PYTHONPATH=$ROOT:$SITE $SP bench --api-base http://127.0.0.1:$PORT --model-dir "$1" --trust-remote-code \
    "$2" "$3" --no-warmup --settle 0 -o "$4"
}

profile_of() { local p=${1%-first}; echo ${p%-last}; }  # fast-first, fast-last: profile fast again
serves_w4() { case $(profile_of $1) in bf16|bf16-gla|fp8) return 1 ;; esac; }  # a GPTQ checkpoint: Marlin
# The fork tree a run is served on (lib.sh makes each once per machine). A tree's first server pays the one-off
# compilation on its first long prompt (100-135 s); later servers on the same tree do not (15-21 s): fast-gla-off is
# fast-gla's tree with patch 06 switched off (SOARPACK_GLA_DECODE=fork, the fork's own decode lines), so a with/without
# comparison pays that once and differs by the switch alone.
tree_of() {
  case $(profile_of $1) in
    bf16) echo $BF16_TREE ;; fp8|safe) echo fork ;; fast) echo fork-d ;; fast-gla|fast-gla-off) echo fork-gla ;;
    bf16-gla) [ $BF16_TREE = fork-gla ] && echo fork-gla || echo fork-g ;;  # with BF16_TREE=fork-gla: bf16's tree, 06 on
    fast-fp8) echo fork-f8 ;; *) echo none ;;
  esac
}
tree_path() {  # $1 a tree_of name: prints its python/ folder, patching it first if this machine has not yet
  case $1 in
    fork) echo $FORK ;; fork-d) patched_fork ;; fork-gla) fork_gla ;; fork-g) fork_g ;; fork-f8) fork_f8 ;; *) return 1 ;;
  esac
}

# What a run costs, in seconds, from the lease of 2026-12-04 (benchmarks/RESULTS.md §14; §11-§12 agree): the server's
# start 65 (the machine's first: +160, FlashInfer's JIT), the one-row pre-warm 15 (a tree's first: +115), the S8
# pre-warm 20 a set, then for each set and tier both clients: twice bf16's duration there plus 33 (the organisers'
# script about 21 s a tier: its import, tokenizer and warm-up; soarpack bench about 12), and 5 to stop. bf16's
# durations stand in for every profile's (an upper bound for the faster ones); long-32k's are guessed (never served)
# from its 10 rows' 0.80 M prompt tokens at long-128k's S8 rate, 16 K tokens/s (278 K in 17 s), plus S1's decode.
# Setup: install and models 75, speed sets 30, the w4a8 copy 40.
tier_s() {  # $1 set, $2 tier: bf16's duration, s
  case $1:$2 in
    1of16:S1) echo 20 ;; 1of16:*) echo 13 ;; long-128k:S1) echo 25 ;; long-128k:*) echo 17 ;;
    long-32k:S1) echo 70 ;; *) echo 55 ;;
  esac
}
run_cost() {  # $1 run, $2 1 if it is the machine's first server, $3 1 if it is its tree's first
  local s=$(( 65 + 15 + 5 + ($2 == 1 ? 160 : 0) + ($3 == 1 ? 115 : 0) )) set tier
  if [[ " $TIERS " == *" S8 "* || " $TIERS " == *" Smax "* ]]; then s=$(( s + 20 * $(echo $SETS | wc -w) )); fi
  for set in $SETS; do for tier in $TIERS; do s=$(( s + 2 * $(tier_s $set $tier) + 33 )); done; done
  echo $s
}
setup_cost() { echo $(( 75 + 30 + $(plan_has fast-fp8 && echo 40 || echo 0) )); }
# What a server's one-off compilation is keyed on, as far as the leases show: its tree, and on fork-gla patch 06's
# switch (on an H100 the second server on fork-gla, the switch flipped, paid its first long prompt's compilation
# again: RESULTS.md §15).
compiled_as() {
  local tree=$(tree_of $1)
  [ $tree = fork-gla ] || { echo $tree; return; }
  case $(profile_of $1) in bf16|fast-gla-off) echo $tree:fork ;; *) echo $tree:inplace ;; esac
}
tree_first() { [[ " $2 " == *" $(compiled_as $1) "* ]] && echo 0 || echo 1; }  # $1 run, $2 compiled_as of those served
# The gate's question for a middle run (it and the last bf16 must fit in what is left); $1 run, $2 the trees served
# so far (names, space-separated): prints the seconds both need.
# COST_PCT scales both: 100 before a lease; in the run, what the first bf16 server took against its estimate.
COST_PCT=100
gate_need() { echo $(( ($(run_cost $1 0 $(tree_first $1 "$2")) + $(run_cost bf16-last 0 0)) * COST_PCT / 100 )); }
# PLAN's cost as the gate will see it, before any device time is spent: each run's estimate, the total, and the runs
# the gate would skip under BUDGET_S (the device's start, 30-180 s, and the calls' transfers come on top).
estimate() {
  local t=$(setup_cost) trees="" run c first_tree need skipped=""
  echo "setup: $t s (install, models$(plan_has fast-fp8 && echo ', w4a8'), speed sets)"
  for run in $PLAN; do
    case $run in bf16-last) continue ;; esac
    if [ $run != bf16-first ]; then
      need=$(gate_need $run "$trees")
      if [ $(( t + need )) -gt "$BUDGET_S" ]; then skipped+=" $run"; echo "$run: skipped at $t s (it and the last bf16: $need s)"; continue; fi
    fi
    first_tree=$(tree_first $run "$trees")
    c=$(run_cost $run $([ $run = bf16-first ] && echo 1 || echo 0) $first_tree); t=$(( t + c )); trees+=" $(compiled_as $run)"
    echo "$run: $c s on $(compiled_as $run)$([ $first_tree = 1 ] && echo ' (its first server)'), done at $t s"
  done
  c=$(run_cost bf16-last 0 0); t=$(( t + c )); echo "bf16-last: $c s, done at $t s"
  echo "total: about $t s of BUDGET_S=$BUDGET_S for PLAN=\"$PLAN\" SETS=\"$SETS\" TIERS=\"$TIERS\"${skipped:+; skipped:$skipped}"
  [[ " $SETS " != *" long-32k "* ]] || echo "long-32k's durations are guessed (never served)"
}
needs_marlin() { local run; for run in $PLAN; do serves_w4 $run && return 0; done; return 1; }
plan_has() { local run; for run in $PLAN; do [ "$(profile_of $run)" = "$1" ] && return 0; done; return 1; }

serve_profile() {  # $1 run name: bf16, bf16-gla, safe, fast, fast-gla, fast-gla-off, fp8, fast-fp8 (any with -first/-last)
  local run=$1 ckpt=$M/w4 fork flags=(--marlin-so "$MARLIN_ABS") extra=$SERVE_EXTRA t=$(date +%s)
  SERVER_ENV_ADD=()
  case $(profile_of $run) in  # the tree: tree_of
    bf16) ckpt=$M/bf16; flags=(--bf16)  # BF16_TREE=fork-gla: patch 04 never touches bf16, and 06 is switched off
      [ $BF16_TREE != fork-gla ] || SERVER_ENV_ADD=(SOARPACK_GLA_DECODE=fork) ;;
    fp8) ckpt=$M/bf16; flags=(--bf16); extra="$SERVE_EXTRA --quantization fp8" ;;  # the fork's own W8A8, online
    fast|fast-gla|safe) ;;  # w4-mlp: patch 04; patches 04 + 06; no patch
    fast-gla-off) SERVER_ENV_ADD=(SOARPACK_GLA_DECODE=fork) ;;  # patches 04 + 06, 06 switched to the fork's decode
    bf16-gla) ckpt=$M/bf16; flags=(--bf16) ;;  # patch 06 alone
    fast-fp8) ckpt=$M/w4a8 ;;  # w4-mlp-w8-attn; patches 04 + 05 at their thresholds
    *) log "no such profile run: $run"; return 2 ;;
  esac
  fork=$(tree_path $(tree_of $run)) || return 1
  log "server $run: $ckpt on $fork ($extra)${SERVER_ENV_ADD[*]:+ with ${SERVER_ENV_ADD[*]}}"
  server_up "$R/server-$run.log" "$ckpt" "$fork" "$extra" "${flags[@]}" || return 1
  local rc=0
  server_wait > "$R/health-$run.json" || rc=$?
  if [ $rc -eq 0 ]; then
    log "server $run healthy ($(cat $R/health-$run.json)); pre-warm"
    echo $(compiled_as $run) >> $R/trees-served  # its first long prompt compiles: the gate's next price
    local tw=$(date +%s)
    untimed "$ckpt" --s1 $R/prewarm.jsonl "$R/prewarm-$run.json" > "$R/prewarm-$run.log" 2>&1
    echo $(( $(date +%s) - tw )) > "$R/prewarm-s-$run"
    # Then, when a tier sends many requests at once, each set's first 8 rows at once (cut, 8 tokens out). In §13 the
    # client that ran S8 first on a fresh server took 0.3-0.5 s (2.6-3.9 %) longer than the other, which the one-row
    # pre-warm does not cover: if that is the server's first many-prompt batch (a one-off the platform's S8 pays once
    # in ~1300 s), this takes it out of both clients' timings; if the clients still differ, it was not.
    if [[ " $TIERS " == *" S8 "* || " $TIERS " == *" Smax "* ]]; then
      tw=$(date +%s)
      for set in $SETS; do
        untimed "$ckpt" --s8 $R/prewarm-$set.jsonl "$R/prewarm8-$run-$set.json" >> "$R/prewarm-$run.log" 2>&1
      done
      echo $(( $(date +%s) - tw )) > "$R/prewarm8-s-$run"
      log "$run: pre-warm at S8 on each set in $(cat $R/prewarm8-s-$run) s"
    fi
    # FIRST_CLIENT on the first set, the other client first on the next (the order alternates between the sets); the
    # same on every server, like for like: which client runs first on a fresh server has shown a gap at S8 (§13).
    local first=$FIRST_CLIENT
    for set in $SETS; do
      if [ $first = ours ]; then
        log "$run $set: soarpack bench"; ours "$run-$set" $R/speed-$set.jsonl "$ckpt" || rc=1
        log "$run $set: organisers'"; organisers "$run-$set" $R/speed-$set.jsonl || rc=1
        first=organisers
      else
        log "$run $set: organisers'"; organisers "$run-$set" $R/speed-$set.jsonl || rc=1
        log "$run $set: soarpack bench"; ours "$run-$set" $R/speed-$set.jsonl "$ckpt" || rc=1
        first=ours
      fi
    done
  fi
  server_down
  grep -E "Load weight end|Capture cuda graph end|KV Cache is allocated|max_total_num_tokens|w4-dispatch|fp8-prefill" \
    "$R/server-$run.log" | head -20 > "$R/server-$run.lines"
  [ $rc -eq 0 ] || tail -60 "$R/server-$run.log" > "$R/server-$run.tail"
  echo $(( $(date +%s) - t )) > "$R/took-$run"
  log "server $run done in $(cat $R/took-$run) s, rc=$rc"
  return $rc
}

gla_check() {  # issue 38's kernel check of patch 06: bit-identity with the fork's decode, the Lightning layer's time
  log "gla decode (patch 06): identity and layer timing"
  local tiny=(); [ -z "${REHEARSAL:-}" ] || tiny=(--tiny)
  env ${REHEARSAL:+TRITON_INTERPRET=1} PYTHONPATH=$SITE timeout 300 python3 benchmarks/gpu_gla_decode.py --fork-src $FORK \
    "${tiny[@]}" --json $R/gla_decode.json > $R/gla_decode.log 2>&1
  log "gla decode rc=$?"
}

run() {
  date +%s > $R/t0; echo running > $R/state
  # A run that dies (a bash error, a kill) must not leave `wait` polling a "running" state until its timeout.
  trap '[ "$(cat $R/state)" != running ] || { echo died > $R/state; log "run died"; }; server_down' EXIT
  case $FIRST_CLIENT in ours|organisers) ;; *) log "FIRST_CLIENT=$FIRST_CLIENT: ours or organisers"; echo failed > $R/state; return 1 ;; esac
  case $BF16_TREE in fork|fork-gla) ;; *) log "BF16_TREE=$BF16_TREE: fork or fork-gla"; echo failed > $R/state; return 1 ;; esac
  declare -p SETS TIERS SERVE_EXTRA FIRST_CLIENT BF16_TREE > $R/settings  # what `again` runs with
  log "run: LAYERS=$LAYERS ROWS_SHORT=$ROWS_SHORT ROWS_LONG=$ROWS_LONG ROWS_LONG32=$ROWS_LONG32 BUDGET_S=$BUDGET_S PLAN=$PLAN SETS=$SETS TIERS=$TIERS GLA=$GLA FIRST_CLIENT=$FIRST_CLIENT BF16_TREE=$BF16_TREE"
  estimate | sed 's/^/estimate: /' >> $R/run.log  # set against the "done in" lines after, it checks run_cost
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
  if [ -n "${REHEARSAL:-}" ]; then  # a CPU rehearsal: models, site and Marlin are the rehearsal's own
    (mkdir -p $GS_WORK/mb && touch $GS_WORK/mb/rehearsal.so && echo "rehearsal: no build") > $R/marlin.log 2>&1 &
  else
    install_carried > $R/install.log 2>&1 || { log "install failed"; echo failed > $R/state; return 1; }
    # No build when no run serves W4: it would only load the CPU under the bf16 servers being timed.
    if needs_marlin; then marlin_build > $R/marlin.log 2>&1 & else echo "no run serves W4: no build" > $R/marlin.log & fi
  fi
  local marlin_pid=$!
  log "models"; build_models $(needs_marlin || echo bf16) > $R/build.log 2>&1 || { log "build failed"; echo failed > $R/state; return 1; }
  if plan_has fast-fp8; then  # its recipe: every linear GPTQ-Marlin, so FP8 prefill covers them all
    build_copy w4a8 w4-mlp-w8-attn >> $R/build.log 2>&1 || { log "w4a8 build failed"; echo failed > $R/state; return 1; }
  fi
  log "speed sets"; make_sets > $R/sets.log 2>&1 || { log "speed sets failed"; echo failed > $R/state; return 1; }
  # Before the servers, while Marlin builds on the CPU (the GPU is otherwise idle then): patch 06's check.
  [ "$GLA" != first ] || gla_check
  serve_profile bf16-first
  wait $marlin_pid; local mrc=$?
  MARLIN_ABS=$(marlin_so)
  log "marlin build rc=$mrc: ${MARLIN_ABS:-none} ($(tail -1 $R/marlin.log))"
  # The middle runs, in PLAN's order, each only if it and the last bf16 still fit in BUDGET_S (run_cost's estimates,
  # a tree's first server dearer, scaled by the first bf16's measured cost: a set whose durations are guessed, or a
  # slower machine, corrects itself); the last bf16 always runs.
  local run need est_first=$(run_cost bf16-first 1 1) took_first
  took_first=$(cat $R/took-bf16-first 2>/dev/null || echo $est_first)
  COST_PCT=$(( 100 * took_first / est_first ))
  log "cost: bf16-first took $took_first s against the estimate's $est_first: later runs priced at $COST_PCT %"
  for run in $PLAN; do
    case $run in bf16-first|bf16-last) continue ;; esac
    if serves_w4 $run && { [ $mrc -ne 0 ] || [ -z "$MARLIN_ABS" ]; }; then log "$run skipped: no Marlin extension"; continue; fi
    need=$(gate_need $run "$(cat $R/trees-served 2>/dev/null | tr '\n' ' ')")
    if [ $(( $(elapsed) + need )) -gt "$(budget)" ]; then
      log "$run skipped: $(elapsed) s gone, it and the last bf16 need about $need s of the $(budget)"; continue
    fi
    serve_profile $run
  done
  serve_profile bf16-last
  if [ "$GLA" = last ] && [ $(( $(elapsed) + 200 )) -le "$(budget)" ]; then gla_check
  elif [ "$GLA" = last ]; then log "gla decode skipped: $(elapsed) s gone of $(budget)"; fi
  log "run done after $(elapsed) s"; echo done > $R/state
}

collect() {
  mkdir -p "$OUT_FINAL"
  cp $R/run.log $R/sets.json "$OUT_FINAL"/ 2>/dev/null
  tar -czf "$OUT_FINAL/ruler-results.tgz" -C $R --exclude standin --exclude "prewarm*.jsonl" . 2>/dev/null
  # The Marlin extension this machine built (3.9 MiB), for the next lease to carry in .whl; a rehearsal's is empty.
  local so=$(marlin_so); [ -z "$so" ] || [ ! -s "$so" ] || cp "$so" "$OUT_FINAL/"
  ls -la "$OUT_FINAL"; cat $R/state 2>/dev/null; tail -5 $R/run.log 2>/dev/null
  # Every run the gate left out, however early: a tail of five lines once showed one of two skips (RESULTS.md §14).
  grep -E "\] [^ ]+ skipped: " $R/run.log 2>/dev/null | sed 's/^/SKIPPED /' || true
}

wait_done() {  # $1 seconds at most: until the run is no longer running; with $2 = collect, collect after each server
  local until=$(( $(date +%s) + $1 )) servers=-1 n
  while [ "$(cat $R/state 2>/dev/null)" = running ] && [ "$(date +%s)" -lt $until ]; do
    # A call cut short by the session's device budget brings back only what $OUT holds then: every finished server.
    n=$(grep -c "^\[[0-9:]*\] server .* done in " $R/run.log 2>/dev/null)
    if [ "${2:-}" = collect ] && [ "${n:-0}" != "$servers" ]; then collect > /dev/null; servers=${n:-0}; fi
    sleep 5
  done
}
wait_for() { wait_done "$1" collect; collect; }

case ${1:-} in
  start)
    rm -rf "$R"/*; echo starting > $R/state
    OUT=$OUT_FINAL setsid nohup bash "$0" run > $R/driver.log 2>&1 < /dev/null &
    sleep 2; wait_for "${2:-540}" ;;
  wait)
    if [ -n "${BUDGET_LEFT_S:-}" ]; then
      [[ $BUDGET_LEFT_S =~ ^[0-9]+$ ]] || { echo "BUDGET_LEFT_S=$BUDGET_LEFT_S: seconds, a whole number" >&2; exit 2; }
      [ "$(cat $R/state 2>/dev/null)" = running ] && set_budget "$BUDGET_LEFT_S"
    fi
    wait_for "${2:-540}" ;;
  collect) collect ;;
  estimate) estimate ;;  # no device needed: run it here before a lease
  run) run ;;
  again)  # one more run on the machine a finished run left (its models, sets, trees and settings), then collect
    : "${2:?a run name}"; wait_done "${3:-120}"
    [ "$(cat $R/state 2>/dev/null)" = done ] || { echo "the run is not done" >&2; exit 1; }
    . $R/settings; MARLIN_ABS=$(marlin_so)  # a W4 run again needs the run's Marlin extension
    # As in run: killed (the device call's timeout), it must not leave a "running" state nor its server up.
    trap '[ "$(cat $R/state)" != running ] || { echo died > $R/state; log "again died"; }; server_down' EXIT
    echo running > $R/state; log "again: $2"; serve_profile "$2"; rc=$?; echo done > $R/state
    collect; exit $rc ;;  # the server's rc: a failed again is not a silent 0
  *) echo "usage: $0 start [S] | wait S | collect | estimate | again RUN [S]" >&2; exit 2 ;;
esac
