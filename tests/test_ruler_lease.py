"""benchmarks/gpu_serve/ruler_lease.sh rehearsed end to end on the CPU, before a GPU lease spends device time on it.

The real script (with lib.sh) runs its whole plan as on the device: `run` (speed sets, then one fresh server after
another, each pre-warmed and timed by both clients: `soarpack bench` and the organisers' own bench_serving.sh, the
fork's sglang.bench_serving), then `collect`, then `again RUN` on what the run left. What the CPU cannot do stands in:
REHEARSAL=1 skips the install and the Marlin build (a fake rehearsal.so) and gives the organisers' client a stand-in
sglang package root; the models are a tiny SALA tokenizer under $M/bf16, $M/w4 and $M/w4a8 (no weights: the servers
are stand-ins); LAUNCH is tests/ruler_standin_launch.py, which takes launch.py's command line, records it and becomes
`soarpack fake-server`. The organisers' script and the fork's tree come from ../shared at test time, never copied.

What is checked is what a lease brings back: every planned server healthy and done with rc=0, both clients' numbers
for every tier on every server (the organisers' client first: FIRST_CLIENT), the S8 pre-warm, sets.json's hash of
the speed file, which checkpoint, fork tree (its patches, read back by soarpack.serve.patches) and flags each server
got, `again` running with the run's own settings, ruler-results.tgz rendering ruler_table.py's table, the budget gate
skipping a middle run but never the last bf16, and no server left running.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from test_bench_conformance import _python_bin, tokenizer_side, toolkit_dir
from under_test import SOARPACK_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

ROOT = Path(SOARPACK_ROOT)
GPU_SERVE = ROOT / "benchmarks" / "gpu_serve"
SCRIPT = GPU_SERVE / "ruler_lease.sh"
STANDIN_LAUNCH = Path(__file__).resolve().parent / "ruler_standin_launch.py"
LAYERS = 2
ROWS = 3
PREWARM_CHARS = 1000  # below the longest of the rows: the pre-warm's cut is exercised
SET = "1of16"
# bf16 on the unpatched fork; W4 on the w4-dispatch + gla-decode-in-place tree, first with patch 06 switched off
# (SOARPACK_GLA_DECODE=fork), then on; the w4-mlp-w8-attn copy with w4-dispatch + fp8-prefill; `again` then serves
# bf16-gla (bf16 with gla-decode-in-place alone). `fast` (w4-dispatch alone) is the budget test's `again`.
PLAN = ("bf16-first", "fast-gla-off-first", "fast-gla", "fast-fp8", "bf16-last")
AGAIN = "bf16-gla"
TIERS = ("S1", "S8")
# What each run serves: checkpoint under $M, fork tree under $GS_WORK (None: the unpatched $FORK), the patches that
# tree has applied, and whether it is served as bf16 (else with the Marlin extension).
GLA = {"w4-dispatch", "gla-decode-in-place"}
SERVED = {"bf16-first": ("bf16", None, set(), True), "bf16-last": ("bf16", None, set(), True),
          "fast-gla-off-first": ("w4", "fork-gla", GLA, False), "fast-gla": ("w4", "fork-gla", GLA, False),
          "fast-fp8": ("w4a8", "fork-f8", {"w4-dispatch", "fp8-prefill"}, False),
          "bf16-gla": ("bf16", "fork-g", {"gla-decode-in-place"}, True)}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A tiny SALA checkpoint's tokenizer side (as test_bench_conformance's model_dir): tokenizer, special tokens,
    chat template, generation_config; no config.json (a tiny model's remote code refuses to import) and no weights."""
    return tokenizer_side(tmp_path_factory.mktemp("ruler-tiny"), tmp_path_factory.mktemp("ruler-tokenizer"), LAYERS)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _models(m: Path, tokenizer: Path) -> None:
    """The model build stood in: the tokenizer as each checkpoint, built-$LAYERS (build_models skips), and a config.json
    in w4a8 (build_copy skips a copy that has one; without auto_map, so the tokenizer still loads as data)."""
    for name in ("bf16", "w4", "w4a8"):
        shutil.copytree(tokenizer, m / name)
    (m / "w4a8" / "config.json").write_text(json.dumps({"rehearsal": "stands in for compare.py w4's copy"}))
    (m / f"built-{LAYERS}").touch()


class Lease:
    """One rehearsal's folders and environment; `script(...)` runs ruler_lease.sh in a process group of its own."""

    def __init__(self, tmp: Path, tokenizer: Path, fork: Path, **settings):
        self.work, self.out, self.records = tmp / "work", tmp / "out", tmp / "launched.jsonl"
        self.m, self.r = self.work / "models", self.work / "ruler"
        self.fork = fork
        _models(self.m, tokenizer)
        bin_dir = _python_bin(tmp, sys.executable)  # the script calls python3 by name
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SOARPACK_"))}
        env.update(PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}", REHEARSAL="1", GS_WORK=str(self.work),
                   FORK=str(fork), ORGS_SCRIPT=str(toolkit_dir() / "bench_serving.sh"), LAUNCH=str(STANDIN_LAUNCH),
                   RULER_STANDIN_RECORD=str(self.records), OUT=str(self.out), PORT=str(_free_port()),
                   LAYERS=str(LAYERS), ROWS_SHORT=str(ROWS), PREWARM_CHARS=str(PREWARM_CHARS), SETS=SET,
                   FIRST_CLIENT="organisers", GLA="off", BUDGET_S="100000", WAIT_S="60", TOKENIZERS_PARALLELISM="false")
        env.update(settings)
        self.env = env

    def script(self, *args, timeout=540, **env):
        proc = subprocess.Popen(["bash", str(SCRIPT), *args], cwd=ROOT, env={**self.env, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"ruler_lease.sh {' '.join(args)} ran past {timeout} s:\n{out[-4000:]}")
        return proc.returncode, out

    def launched(self) -> list:
        if not self.records.is_file():
            return []
        return [json.loads(line) for line in self.records.read_text().splitlines()]

    def live_servers(self) -> list:
        """The stand-in servers (their process groups: setsid in lib.sh's server_up) still running."""
        live = []
        for rec in self.launched():
            try:
                cmdline = Path(f"/proc/{rec['pid']}/cmdline").read_bytes()
            except OSError:
                continue
            if b"fake-server" in cmdline:
                live.append(rec["pid"])
        return live

    def stop_servers(self) -> None:
        for pid in self.live_servers():
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass

    def log(self) -> str:
        return (self.r / "run.log").read_text()

    def state(self) -> str:
        return (self.r / "state").read_text().strip()


def _lines(log: str) -> list:
    return [re.sub(r"^\[[0-9:]+\] ", "", line) for line in log.splitlines()]


@pytest.fixture(scope="module")
def lease(tokenizer_dir, sglang_fork_trees, tmp_path_factory):
    """`run` with PLAN, `collect` (its tgz kept aside), then `again bf16-gla` with other SETS/TIERS/FIRST_CLIENT in
    the environment than the run's (again must read the run's settings)."""
    lease = Lease(tmp_path_factory.mktemp("ruler-lease"), tokenizer_dir, sglang_fork_trees["d29fb130c"],
                  PLAN=" ".join(PLAN), TIERS=" ".join(TIERS))
    try:
        lease.run_rc, lease.run_out = lease.script("run")
        lease.run_log, lease.run_state = lease.log(), lease.state()
        lease.live_after_run = lease.live_servers()
        lease.collect_rc, lease.collect_out = lease.script("collect", timeout=60)
        lease.collected = lease.out.parent / "collected-after-run.tgz"
        shutil.copy2(lease.out / "ruler-results.tgz", lease.collected)
        lease.again_rc, lease.again_out = lease.script("again", AGAIN, "30", TIERS="S1", SETS="long-128k",
                                                       FIRST_CLIENT="ours")
        lease.live_after_again = lease.live_servers()
        yield lease
    finally:
        lease.stop_servers()


def _unpack(tgz: Path, dest: Path) -> Path:
    dest.mkdir()
    with tarfile.open(tgz) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return dest


def test_the_run_serves_every_planned_server_healthy_with_the_organisers_client_first(lease):
    assert lease.run_rc == 0, lease.run_out[-4000:]
    assert lease.run_state == "done", lease.run_out[-4000:]
    lines = _lines(lease.run_log)
    assert not [line for line in lines if "skipped" in line or "died" in line or "failed" in line], lease.run_log
    assert lines[-1].startswith("run done after "), lease.run_log
    for run in PLAN:
        assert any(line.startswith(f"server {run} healthy ") for line in lines), (run, lease.run_log)
        assert any(re.fullmatch(rf"server {run} done in \d+ s, rc=0", line) for line in lines), (run, lease.run_log)
        assert any(line.startswith(f"{run}: pre-warm at S8 on each set in ") for line in lines), (run, lease.run_log)
        healthy = next(i for i, line in enumerate(lines) if line.startswith(f"server {run} healthy "))
        theirs, ours = lines.index(f"{run} {SET}: organisers'"), lines.index(f"{run} {SET}: soarpack bench")
        assert healthy < theirs < ours, (run, lease.run_log)
    # The servers ran one after another, in PLAN's order.
    starts = [next(i for i, line in enumerate(lines) if line.startswith(f"server {run}: ")) for run in PLAN]
    assert starts == sorted(starts), lease.run_log
    # Every pre-warm request answered (the script itself does not check them).
    for run in PLAN:
        prewarm8 = json.loads((lease.r / f"prewarm8-{run}-{SET}.json").read_text())
        assert prewarm8["tiers"]["s8"]["completed"] == ROWS and prewarm8["tiers"]["s8"]["failed"] == 0


def test_both_clients_time_every_tier_on_every_server(lease):
    for run in (*PLAN, AGAIN):
        summary = json.loads((lease.r / f"orgs-{run}-{SET}.log").read_text().strip().splitlines()[-1])
        assert all(summary[tier] > 0 for tier in TIERS), (run, summary)
        ours = json.loads((lease.r / f"bench-{run}-{SET}.json").read_text())
        assert set(ours["tiers"]) == {t.lower() for t in TIERS}, run
        for tier in ours["tiers"].values():
            assert tier["completed"] == ROWS and tier["failed"] == 0 and tier["duration_s"] > 0, (run, tier)


def test_sets_json_holds_the_speed_files_hash(lease):
    sets = json.loads((lease.r / "sets.json").read_text())
    assert list(sets) == [SET]
    speed = (lease.r / f"speed-{SET}.jsonl").read_bytes()
    assert sets[SET]["sha256"] == hashlib.sha256(speed).hexdigest() and sets[SET]["rows"] == ROWS
    assert len(speed.decode().splitlines()) == ROWS
    # soarpack bench timed that very file.
    bench = json.loads((lease.r / f"bench-bf16-first-{SET}.json").read_text())
    assert bench["tiers"]["s1"]["data_sha256"] == sets[SET]["sha256"]
    # The S8 pre-warm: the set's first rows (8 at most), each question cut to PREWARM_CHARS, 8 words out.
    rows = [json.loads(line) for line in speed.decode().splitlines()]
    warm = [json.loads(line) for line in (lease.r / f"prewarm-{SET}.jsonl").read_text().splitlines()]
    assert len(warm) == min(8, ROWS) and any(len(row["question"]) > PREWARM_CHARS for row in rows[:8])
    for row, w in zip(rows, warm):
        assert w["question"] == row["question"][:PREWARM_CHARS] and len(w["model_response"].split()) == 8


def test_each_server_gets_its_checkpoint_fork_tree_and_flags(lease):
    from soarpack.serve.patches import check_tree

    launched = lease.launched()
    assert [rec["model_path"] for rec in launched] == [str(lease.m / SERVED[run][0]) for run in (*PLAN, AGAIN)]
    assert not [rec for rec in launched if rec["refused"]], launched
    marlin = str(lease.work / "mb" / "rehearsal.so")
    for run, rec in zip((*PLAN, AGAIN), launched):
        ckpt, tree, patches, bf16 = SERVED[run]
        want_fork = lease.fork if tree is None else lease.work / tree / "python"
        assert rec["fork_src"] == str(want_fork), run
        report = check_tree(rec["fork_src"])
        assert report.commit in ("d29fb130c", None)
        assert {p.name for p in report.patches if p.status == "applied"} == patches, (run, report.to_dict())
        assert rec["bf16"] is bf16 and rec["marlin_so"] == (None if bf16 else marlin), (run, rec)
        assert rec["extra"] == ["--cuda-graph-max-bs", "16"], run
        # Patch 06's switch: set to the fork's decode for fast-gla-off only, never left over for the next server.
        assert rec["gla_decode"] == ("fork" if run.startswith("fast-gla-off") else None), (run, rec)
        assert rec["argv"][rec["argv"].index("--port") + 1] == lease.env["PORT"]
        if bf16:
            assert "--quantization" not in rec["server_argv"], run
    assert (lease.m / "w4a8" / "config.json").is_file()


def test_again_serves_one_more_run_with_the_runs_settings(lease):
    assert lease.again_rc == 0, lease.again_out[-4000:]
    assert lease.state() == "done"
    lines = _lines(lease.log())[len(_lines(lease.run_log)):]
    assert lines[0] == f"again: {AGAIN}", lines
    assert any(re.fullmatch(rf"server {AGAIN} done in \d+ s, rc=0", line) for line in lines), lines
    # The run's SETS, TIERS and FIRST_CLIENT, not the environment's (long-128k, S1, ours).
    assert lines.index(f"{AGAIN} {SET}: organisers'") < lines.index(f"{AGAIN} {SET}: soarpack bench"), lines
    assert any(line.startswith(f"{AGAIN}: pre-warm at S8 ") for line in lines), lines
    assert not [line for line in lines if "long-128k" in line], lines


def test_the_collected_results_render_the_ruler_table_naming_every_run(lease, tmp_path):
    assert lease.collect_rc == 0, lease.collect_out[-3000:]
    assert (lease.out / "run.log").is_file() and (lease.out / "sets.json").is_file()
    after_run = _unpack(lease.collected, tmp_path / "after-run")
    assert not (after_run / "standin").exists() and not list(after_run.glob("prewarm*.jsonl"))
    assert {p.name for p in after_run.glob("bench-*.json")} == {f"bench-{run}-{SET}.json" for run in PLAN}
    final = _unpack(lease.out / "ruler-results.tgz", tmp_path / "final")
    table = subprocess.run([sys.executable, str(GPU_SERVE / "ruler_table.py"), str(final)], capture_output=True,
                           text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    for run in (*PLAN, AGAIN):
        for tier in TIERS:
            row = re.search(rf"^\| {re.escape(run)} \| {SET} \| {tier} \| ([0-9.]+) \| ([0-9.]+) \| [-+0-9.]+ % \| "
                            rf"organisers' \|$", table.stdout, re.M)
            assert row and float(row.group(1)) > 0 and float(row.group(2)) > 0, (run, tier, table.stdout)


def test_no_server_is_left_running(lease):
    assert len(lease.launched()) == len(PLAN) + 1
    assert lease.live_after_run == [] and lease.live_after_again == []


def test_the_budget_gate_skips_a_middle_run_but_never_the_last_bf16_and_again_serves_it(tokenizer_dir,
                                                                                        sglang_fork_trees, tmp_path):
    """BUDGET_S=1: fast is skipped, bf16-first and bf16-last run (on fork-gla's tree, patch 06 switched off:
    BF16_TREE); then `again fast` (the next call's way to serve what the budget left out) serves it with the run's
    Marlin extension; then an `again` killed mid-way."""
    lease = Lease(tmp_path, tokenizer_dir, sglang_fork_trees["d29fb130c"], PLAN="bf16-first fast bf16-last",
                  TIERS="S1", BUDGET_S="1", GLA="last", BF16_TREE="fork-gla")
    try:
        rc, out = lease.script("run")
        assert rc == 0 and lease.state() == "done", out[-4000:]
        lines = _lines(lease.log())
        assert any(re.fullmatch(r"fast skipped: \d+ s gone, it and the last bf16 need about \d+ s of the 1", line)
                   for line in lines), lines
        assert any(line.startswith("gla decode skipped: ") for line in lines), lines
        for run in ("bf16-first", "bf16-last"):
            assert any(re.fullmatch(rf"server {run} done in \d+ s, rc=0", line) for line in lines), (run, lines)
        assert not any(line.startswith("server fast") for line in lines), lines
        assert [rec["model_path"] for rec in lease.launched()] == [str(lease.m / "bf16")] * 2
        assert [(rec["fork_src"], rec["gla_decode"]) for rec in lease.launched()] == [
            (str(lease.work / "fork-gla" / "python"), "fork")] * 2
        assert not any("pre-warm at S8" in line for line in lines), lines  # TIERS has neither S8 nor Smax
        rc, out = lease.script("collect", timeout=60)  # what a device call prints names every skipped run
        assert rc == 0 and re.search(r"^SKIPPED \[[0-9:]+\] fast skipped: ", out, re.M), out[-2000:]
        assert set(json.loads((lease.r / f"bench-bf16-last-{SET}.json").read_text())["tiers"]) == {"s1"}
        assert not list(lease.r.glob("bench-fast-*"))
        assert lease.live_servers() == []

        rc, out = lease.script("again", "fast", "30")
        assert rc == 0 and lease.state() == "done", out[-4000:]
        fast = lease.launched()[-1]
        assert fast["model_path"] == str(lease.m / "w4") and not fast["refused"], fast
        assert fast["marlin_so"] == str(lease.work / "mb" / "rehearsal.so") and fast["fork_src"] == str(
            lease.work / "fork-d" / "python") and fast["gla_decode"] is None, fast
        assert re.search(r"server fast done in \d+ s, rc=0", lease.log()), lease.log()
        assert set(json.loads((lease.r / f"bench-fast-{SET}.json").read_text())["tiers"]) == {"s1"}
        assert lease.live_servers() == []

        # An `again` whose server fails exits with its rc (a device call must see it), the state left usable.
        rc, out = lease.script("again", "turbo", "30")
        assert rc == 2 and lease.state() == "done" and "no such profile run: turbo" in lease.log(), out[-2000:]

        # An `again` cut short (the device call's timeout sends TERM) says so and leaves no server behind.
        proc = subprocess.Popen(["bash", str(SCRIPT), "again", "bf16-last", "30"], cwd=ROOT, env=lease.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while len(lease.launched()) < 4 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            assert len(lease.launched()) == 4 and proc.poll() is None, "again bf16-last started no server"
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert lease.state() == "died" and _lines(lease.log())[-1] == "again died", lease.log()[-2000:]
        assert lease.live_servers() == []
    finally:
        lease.stop_servers()


def test_wait_with_the_device_time_left_resets_the_gates_budget(tokenizer_dir, sglang_fork_trees, tmp_path):
    """`start` with a budget that fits everything, then `wait` told that little device time is left (the session's
    budget_left_s from the last call's reply): the gate prices the middle run against that, skips it, and the last
    bf16 still runs."""
    lease = Lease(tmp_path, tokenizer_dir, sglang_fork_trees["d29fb130c"], PLAN="bf16-first fast bf16-last",
                  TIERS="S1", BUDGET_S="100000")
    try:
        rc, out = lease.script("start", "0", timeout=120)
        assert rc == 0 and lease.state() == "running", out[-2000:]  # bf16-first is still being served
        # No device time left (less 1 s kept back): whatever the gate's scaled prices, the middle run cannot fit.
        rc, out = lease.script("wait", "400", BUDGET_LEFT_S="0", BUDGET_MARGIN_S="1")
        assert rc == 0 and lease.state() == "done", out[-4000:]
        lines = _lines(lease.log())
        budget = [re.fullmatch(r"budget: (-?\d+) s of the run \((\d+) s gone, 0 s of device time left, 1 s kept back\)",
                               line) for line in lines]
        budget = [m for m in budget if m]
        assert len(budget) == 1 and int(budget[0][1]) == int(budget[0][2]) - 1, lines
        assert any(re.fullmatch(rf"fast skipped: \d+ s gone, it and the last bf16 need about \d+ s of the "
                                rf"{budget[0][1]}", line) for line in lines), lines
        assert re.search(r"^SKIPPED \[[0-9:]+\] fast skipped: ", out, re.M), out[-2000:]
        assert any(re.fullmatch(r"server bf16-last done in \d+ s, rc=0", line) for line in lines), lines
        rc, out = lease.script("wait", "1", BUDGET_LEFT_S="soon")
        assert rc == 2 and "BUDGET_LEFT_S=soon: seconds, a whole number" in out, out
    finally:
        lease.stop_servers()
