"""The served table: `soarpack bench` results side by side, per tier, with each run's duration ratio to a baseline.

    python benchmarks/gpu_serve/served_table.py bf16=bench-bf16.json w4=bench-w4.json ... [--baseline bf16]

Per tier and run: duration, its ratio baseline/run (> 1: faster than the baseline), TTFT mean/median/p99, the
stream's inter-token time (ITL) mean/median/p99, TPOT mean/median when the result records it (soarpack bench from
2026-12-01 on: per request (e2e - TTFT) / (output tokens - 1), as bench_serving), and output tokens per second.
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(spec: str):
    label, sep, path = spec.partition("=")
    if not sep:
        raise SystemExit(f"error: {spec!r}: write LABEL=PATH")
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if data.get("kind") != "soarpack.bench":
        raise SystemExit(f"error: {path} is not a soarpack bench result")
    return label, data


def fmt(summary, *keys):
    if not summary:
        return "-"
    return " / ".join(f"{summary[k]:.1f}" if summary[k] >= 10 else f"{summary[k]:.2f}" for k in keys)


def render(runs, baseline: str) -> str:
    base = dict(runs)[baseline]
    lines = ["tier | run | duration s | ratio to " + baseline + " | TTFT ms mean / median / p99 | "
             "ITL ms mean / median / p99 | TPOT ms mean / median | output tok/s",
             "---|---|---|---|---|---|---|---"]
    tiers = sorted({t for _, data in runs for t in data["tiers"]})
    for tier in tiers:
        for label, data in runs:
            t = data["tiers"].get(tier)
            if t is None:
                continue
            b = base["tiers"].get(tier)
            ratio = f"{b['duration_s'] / t['duration_s']:.2f}x" if b and t["duration_s"] else "-"
            lines.append(f"{tier} | {label} | {t['duration_s']:.2f} | {ratio} | {fmt(t.get('ttft_ms'), 'mean', 'median', 'p99')} | "
                         f"{fmt(t.get('itl_ms'), 'mean', 'median', 'p99')} | {fmt(t.get('tpot_ms'), 'mean', 'median')} | "
                         f"{t['output_throughput']:.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="LABEL=PATH")
    ap.add_argument("--baseline", help="the run the ratios are to (default: the first)")
    a = ap.parse_args(argv)
    runs = [load(spec) for spec in a.runs]
    baseline = a.baseline or runs[0][0]
    if baseline not in dict(runs):
        raise SystemExit(f"error: no run is labelled {baseline!r}")
    print(render(runs, baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
