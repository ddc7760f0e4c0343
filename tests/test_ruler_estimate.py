"""`ruler_lease.sh estimate`: a PLAN's cost and what the budget gate would skip, known before any device time is spent.

The cost model (run_cost) is the one the gate uses during the run. It is held here to what the H200 did: the lease of
2026-12-04 (benchmarks/gpu_serve/results/2026-12-04-fast-lease/run.log, RESULTS.md §14) planned five servers under
BUDGET_S=1400 and its gate skipped fast-gla and fast-last; the estimate for that plan must skip the same runs and price
each server that ran within 10 % of its "done in" time.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from under_test import SOARPACK_ROOT

ROOT = Path(SOARPACK_ROOT)
SCRIPT = ROOT / "benchmarks" / "gpu_serve" / "ruler_lease.sh"
LEASE = ROOT / "benchmarks" / "gpu_serve" / "results" / "2026-12-04-fast-lease" / "run.log"


def _estimate(tmp_path: Path, **settings) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SOARPACK_"))}
    env.update(GS_WORK=str(tmp_path), OUT=str(tmp_path / "out"), **settings)
    proc = subprocess.run(["bash", str(SCRIPT), "estimate"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _recorded_run(log: str) -> dict:
    """The lease's settings line, the runs its gate skipped, and each server's "done in" seconds."""
    settings = re.search(r"\] run: .*?BUDGET_S=(\d+) PLAN=(.*?) SETS=(.*?) TIERS=(.*?) GLA=", log)
    return {"BUDGET_S": settings.group(1), "PLAN": settings.group(2), "SETS": settings.group(3),
            "TIERS": settings.group(4), "skipped": re.findall(r"\] (\S+) skipped: ", log),
            "took": {m.group(1): int(m.group(2)) for m in re.finditer(r"\] server (\S+) done in (\d+) s", log)}}


def test_the_estimate_skips_what_the_h200_gate_skipped_and_prices_each_server_within_10_percent(tmp_path):
    lease = _recorded_run(LEASE.read_text())
    assert lease["skipped"] == ["fast-gla", "fast-last"], lease  # the record itself, as RESULTS.md §14 tells it
    out = _estimate(tmp_path, BUDGET_S=lease["BUDGET_S"], PLAN=lease["PLAN"], SETS=lease["SETS"],
                    TIERS=lease["TIERS"])
    total = re.search(r"^total: about (\d+) s of BUDGET_S=1400 .*; skipped: (.*)$", out, re.M)
    assert total and total.group(2).split() == lease["skipped"], out
    for run in ("bf16-first", "fast-first", "bf16-last"):  # the servers the gate let run (fast-last came by `again`)
        est = int(re.search(rf"^{run}: (\d+) s", out, re.M).group(1))
        assert abs(est - lease["took"][run]) <= 0.10 * lease["took"][run], (run, est, lease["took"][run], out)


def test_servers_on_one_tree_pay_its_compilation_once_per_switch_setting(tmp_path):
    """fast-gla-off runs on fast-gla's tree with patch 06 switched off, and BF16_TREE=fork-gla serves bf16 there with
    it off too: each setting of the switch pays the tree's one-off compilation on its first server only (on the H100,
    RESULTS.md §15, the second server on fork-gla, the switch flipped, paid it again); later servers with either
    setting do not."""
    plan = "bf16-first fast-gla-off-first fast-gla fast-gla-off-last bf16-last"
    out = _estimate(tmp_path, BUDGET_S="100000", PLAN=plan, SETS="1of16", TIERS="S1 S8", BF16_TREE="fork-gla")
    cost = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\S+): (\d+) s", out, re.M)}
    first = {run: "(its first server)" in re.search(rf"^{run}: .*$", out, re.M).group(0) for run in cost
             if run not in ("setup", "total")}
    assert first == {"bf16-first": True, "fast-gla-off-first": False, "fast-gla": True, "fast-gla-off-last": False,
                     "bf16-last": False}, out
    assert re.search(r"^fast-gla: \d+ s on fork-gla:inplace \(its first server\)", out, re.M), out
    assert cost["fast-gla-off-first"] == cost["fast-gla-off-last"] == cost["bf16-last"] < cost["fast-gla"], out
    assert "skipped" not in out, out
    # bf16 on the unpatched fork: fast-gla-off-first is then its setting's first server on fork-gla, one more to pay.
    apart = _estimate(tmp_path, BUDGET_S="100000", PLAN=plan, SETS="1of16", TIERS="S1 S8", BF16_TREE="fork")
    total = lambda text: int(re.search(r"^total: about (\d+) s", text, re.M).group(1))  # noqa: E731
    assert total(apart) - total(out) == cost["fast-gla"] - cost["fast-gla-off-first"], (apart, out)


def test_a_tight_budget_skips_the_runs_that_do_not_fit_and_never_the_bf16_brackets(tmp_path):
    out = _estimate(tmp_path, BUDGET_S="700", PLAN="bf16-first fast fp8 bf16-last", SETS="long-128k",
                    TIERS="S1 S8 Smax")
    assert re.search(r"^fast: skipped at \d+ s", out, re.M) and re.search(r"^fp8: skipped at \d+ s", out, re.M), out
    assert re.search(r"^bf16-first: \d+ s on fork \(its first server\)", out, re.M), out
    assert re.search(r"^bf16-last: \d+ s, done at \d+ s", out, re.M), out
    guessed = _estimate(tmp_path, BUDGET_S="100000", PLAN="bf16-first fast-fp8 bf16-last", SETS="long-32k",
                        TIERS="S8 Smax")
    assert "long-32k's durations are guessed (never served)" in guessed and "w4a8" in guessed, guessed
