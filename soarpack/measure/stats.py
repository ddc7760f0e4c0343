"""Latency summaries in the shape bench_serving prints (mean, median, p90, p99), in milliseconds."""

from __future__ import annotations

import math
from typing import Dict, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary_ms(values_s: Sequence[float]) -> Dict[str, float]:
    values = [v * 1000.0 for v in values_s]
    mean = sum(values) / len(values) if values else 0.0
    return {
        "mean": round(mean, 3),
        "median": round(percentile(values, 50), 3),
        "p90": round(percentile(values, 90), 3),
        "p99": round(percentile(values, 99), 3),
        "max": round(max(values), 3) if values else 0.0,
    }
