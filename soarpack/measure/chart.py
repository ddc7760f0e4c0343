"""A PNG of compared runs: bench tier durations and accuracy per task (needs the `plot` extra: matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence

from soarpack.measure.compare import TIERS, Run
from soarpack.errors import SoarpackError
from soarpack.facts import engine
from soarpack.placement.write import atomic_file


class PlotExtraMissing(SoarpackError):
    """matplotlib is not installed."""


def _grouped_bars(ax, groups: Sequence[str], runs: List[Run], value, ylabel: str, title: str) -> None:
    width = 0.8 / max(len(runs), 1)
    for i, run in enumerate(runs):
        xs = [g + (i - (len(runs) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [value(run, group) or 0.0 for group in groups], width, label=run.name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")


def write_chart(runs: List[Run], path: Path, inputs: Sequence[Path] = ()) -> Path:
    """Two panels: seconds per bench tier (lower is better), accuracy per eval task (higher is better)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotExtraMissing("--chart needs matplotlib, which is not installed",
                               f'pip install matplotlib (or, in the soarpack checkout: pip install '
                               f'"{engine.DEV_TORCH_SPEC}" -e ".[plot]", torch pinned so pip keeps the CPU build)') from None
    tasks = sorted({task for run in runs for task in run.per_task})
    fig, (speed, accuracy) = plt.subplots(1, 2, figsize=(12, 4.5))
    _grouped_bars(speed, list(TIERS), runs, lambda run, tier: run.durations.get(tier), "seconds (lower is better)",
                  "bench duration per tier")
    if tasks:
        _grouped_bars(accuracy, tasks, runs, lambda run, task: run.per_task.get(task), "accuracy %",
                      "eval accuracy per task")
        accuracy.set_ylim(0, 115)  # room for the legend above 100 %
    else:
        accuracy.set_axis_off()
        accuracy.text(0.5, 0.5, "no eval results given", ha="center", va="center")
    fig.tight_layout()
    with atomic_file(path, inputs=inputs, what="--chart") as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path
