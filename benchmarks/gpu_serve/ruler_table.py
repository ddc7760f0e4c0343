"""The tables of a `ruler_lease.sh` run (no GPU): the two clients side by side, and every run against bf16.

    python benchmarks/gpu_serve/ruler_table.py RESULTS_DIR [--baseline bf16-first] [--json OUT]

RESULTS_DIR is the run's folder (ruler-results.tgz unpacked): `bench-RUN-SET.json` from `soarpack bench`, and
`orgs-RUN-SET.log`, the organisers' bench_serving.sh output on the same server (bench_serving's own "Benchmark
duration (s)", "Mean TTFT (ms)", "Mean TPOT (ms)", "Median ITL (ms)" lines, one block per tier).

Table 1, the ruler: per run, set and tier, soarpack's duration against the organisers' (difference in %), and which
client ran first on that server (from run.log's order: ruler_lease.sh's FIRST_CLIENT, alternated between the sets).
Table 2, the profiles: per set and tier, each run's duration by both clients, TTFT and TPOT means, the ITL median,
baseline / run (>1: faster than the baseline run) and TPOT run / baseline (<1: a shorter decode step than the
baseline's). The ITL median is there because the mean TPOT of a few short requests sent at once moves 3-5 % between
two servers of one checkpoint (RESULTS.md §14), while the median inter-token gap and the duration move under 1.5 %.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

TIERS = (("s1", "S1"), ("s8", "S8"), ("smax", "Smax"))
SETS = ("long-128k", "long-32k", "1of16")  # ruler_lease.sh's
# run.log's line before each client's benches: "[hh:mm:ss] RUN SET: soarpack bench" or "... SET: organisers'".
_CLIENT_START = re.compile(r"^\[[0-9:]+\] (\S+) (\S+): (soarpack bench|organisers')$")
_TIER_START = re.compile(r"\[(S1|S8|Smax)\] 开始测试")
_FIELDS = {"duration_s": re.compile(r"^Benchmark duration \(s\):\s+([0-9.]+)"),
           "ttft_ms": re.compile(r"^Mean TTFT \(ms\):\s+([0-9.]+)"),
           "tpot_ms": re.compile(r"^Mean TPOT \(ms\):\s+([0-9.]+)"),
           "itl_median_ms": re.compile(r"^Median ITL \(ms\):\s+([0-9.]+)"),
           "completed": re.compile(r"^Successful requests:\s+([0-9]+)")}


def organisers(log: Path) -> dict:
    """{tier: {duration_s, ttft_ms, tpot_ms, itl_median_ms, completed}} from bench_serving.sh's output."""
    tiers, current = {}, None
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        start = _TIER_START.search(line)
        if start:
            current = {"S1": "s1", "S8": "s8", "Smax": "smax"}[start.group(1)]
            tiers[current] = {}
            continue
        for key, pattern in _FIELDS.items():
            match = pattern.match(line.strip())
            if match and current is not None:
                tiers[current][key] = float(match.group(1))
    return tiers


def ours(bench: Path) -> dict:
    data = json.loads(bench.read_text(encoding="utf-8"))
    return {name: {"duration_s": tier["duration_s"], "ttft_ms": tier["ttft_ms"]["mean"],
                   "tpot_ms": tier["tpot_ms"]["mean"], "itl_median_ms": tier["itl_ms"]["median"],
                   "completed": tier["completed"], "failed": tier["failed"],
                   "short": tier["short_outputs"], "long": tier.get("long_outputs", 0)}
            for name, tier in data["tiers"].items()}


def first_clients(run_log: Path) -> dict:
    """{(run, set): "soarpack" or "organisers'"}: the client that ran first on that server, from run.log."""
    first = {}
    if run_log.is_file():
        for line in run_log.read_text(encoding="utf-8", errors="replace").splitlines():
            match = _CLIENT_START.match(line.strip())
            if match:
                first.setdefault((match.group(1), match.group(2)), match.group(3).replace(" bench", ""))
    return first


def collect(folder: Path) -> dict:
    """{run: {set: {"soarpack": {tier: ...}, "organisers": {tier: ...}}}} for every run with both files."""
    runs = {}
    for bench in sorted(folder.glob("bench-*.json")):
        stem = bench.stem[len("bench-"):]
        for set_name in SETS:
            if stem.endswith("-" + set_name):
                run = stem[: -len(set_name) - 1]
                log = folder / f"orgs-{run}-{set_name}.log"
                runs.setdefault(run, {})[set_name] = {"soarpack": ours(bench),
                                                      "organisers": organisers(log) if log.is_file() else {}}
    return runs


def ruler_table(runs: dict, first: dict) -> str:
    lines = ["| run | set | tier | soarpack bench s | organisers' s | soarpack − organisers' | first on the server |",
             "|---|---|---|---|---|---|---|"]
    for run, sets in runs.items():
        for set_name in SETS:
            both = sets.get(set_name)
            if not both:
                continue
            for key, label in TIERS:
                mine, theirs = both["soarpack"].get(key), both["organisers"].get(key)
                if not mine or not theirs or "duration_s" not in theirs:
                    continue
                diff = 100 * (mine["duration_s"] - theirs["duration_s"]) / theirs["duration_s"]
                lines.append(f"| {run} | {set_name} | {label} | {mine['duration_s']:.2f} | {theirs['duration_s']:.2f} | "
                             f"{diff:+.1f} % | {first.get((run, set_name), '?')} |")
    return "\n".join(lines)


def profile_table(runs: dict, baseline: str) -> str:
    lines = [f"| set | tier | run | soarpack s | organisers' s | {baseline} / run (soarpack, organisers') | "
             f"TTFT ms (s / o) | TPOT ms (s / o) | TPOT run / {baseline} (s, o) | ITL median ms (s / o) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    base = runs.get(baseline, {})
    for set_name in SETS:
        for key, label in TIERS:
            for run, sets in runs.items():
                both = sets.get(set_name)
                if not both or key not in both["soarpack"]:
                    continue
                mine, theirs = both["soarpack"][key], both["organisers"].get(key, {})
                ref = base.get(set_name, {})
                ratios, tpots = [], []
                for client, value, tpot in (("soarpack", mine.get("duration_s"), mine.get("tpot_ms")),
                                            ("organisers", theirs.get("duration_s"), theirs.get("tpot_ms"))):
                    ref_tier = ref.get(client, {}).get(key, {})
                    ref_value, ref_tpot = ref_tier.get("duration_s"), ref_tier.get("tpot_ms")
                    ratios.append(f"{ref_value / value:.2f}x" if ref_value and value else "–")
                    tpots.append(f"{tpot / ref_tpot:.3f}" if ref_tpot and tpot else "–")
                lines.append(f"| {set_name} | {label} | {run} | {mine['duration_s']:.2f} | "
                             f"{theirs.get('duration_s', float('nan')):.2f} | {', '.join(ratios)} | "
                             f"{mine['ttft_ms']:.0f} / {theirs.get('ttft_ms', float('nan')):.0f} | "
                             f"{mine['tpot_ms']:.2f} / {theirs.get('tpot_ms', float('nan')):.2f} | {', '.join(tpots)} | "
                             f"{mine['itl_median_ms']:.2f} / {theirs.get('itl_median_ms', float('nan')):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--baseline", default="bf16-first")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    runs = collect(a.folder)
    if not runs:
        print(f"error: no bench-RUN-SET.json in {a.folder}", file=sys.stderr)
        return 2
    print(ruler_table(runs, first_clients(a.folder / "run.log")))
    print()
    print(profile_table(runs, a.baseline))
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
