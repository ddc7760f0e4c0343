"""benchmarks/gpu_serve/ruler_table.py on a lease's committed files: the figures RESULTS.md §14 quotes come out of it,
and every speed set ruler_lease.sh makes (long-32k too) is read."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from under_test import SOARPACK_ROOT

sys.path.insert(0, str(Path(SOARPACK_ROOT) / "benchmarks" / "gpu_serve"))

import ruler_table  # noqa: E402

LEASE = Path(SOARPACK_ROOT) / "benchmarks" / "gpu_serve" / "results" / "2026-12-04-fast-lease"


def test_the_2026_12_04_lease_gives_the_figures_results_quotes():
    runs = ruler_table.collect(LEASE)
    assert sorted(runs) == ["bf16-first", "bf16-last", "fast-first", "fast-last"]
    s8 = {run: runs[run]["1of16"] for run in runs}
    # Both clients' duration, TPOT mean and ITL median at S8 (RESULTS.md §14's second table).
    assert (s8["fast-first"]["soarpack"]["s8"]["duration_s"], s8["fast-first"]["organisers"]["s8"]["duration_s"]) == (
        9.841361, 9.92)
    assert s8["bf16-first"]["organisers"]["s8"]["tpot_ms"] == 11.29 and s8["bf16-last"]["organisers"]["s8"]["tpot_ms"] == 10.73
    assert s8["bf16-first"]["organisers"]["s8"]["itl_median_ms"] == 7.79
    assert s8["fast-last"]["organisers"]["s8"]["itl_median_ms"] == 6.08
    table = ruler_table.profile_table(runs, "bf16-first")
    assert "| 1of16 | S8 | fast-first | 9.84 | 9.92 | 1.28x, 1.27x | 979 / 1026 | 9.02 / 9.73 | 0.817, 0.862 | 6.01 / 6.02 |" in table
    first = ruler_table.first_clients(LEASE / "run.log")
    assert set(first.values()) == {"organisers'"} and len(first) == 4
    ruler = ruler_table.ruler_table(runs, first)
    assert "| bf16-first | 1of16 | S1 | 20.05 | 19.87 | +0.9 % | organisers' |" in ruler


def test_a_long_32k_set_is_read_beside_the_others(tmp_path):
    for name in ("bench-bf16-first-1of16.json", "orgs-bf16-first-1of16.log"):
        shutil.copy(LEASE / name, tmp_path / name)
        shutil.copy(LEASE / name, tmp_path / name.replace("1of16", "long-32k"))
    runs = ruler_table.collect(tmp_path)
    assert list(runs) == ["bf16-first"] and sorted(runs["bf16-first"]) == ["1of16", "long-32k"]
    assert "| long-32k | S8 | bf16-first | 12.59 | 12.60 |" in ruler_table.profile_table(runs, "bf16-first")
