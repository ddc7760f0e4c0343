"""Typed results of eval, bench, score and compare (what soarpack's Python API returns).

Each wraps the JSON document its command writes or prints: the fields a script reads are attributes, and
`to_dict()` is that document as it is (the file formats stay as they are; `--json` prints `to_dict()`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional


@dataclass
class EvalResult:
    """One `soarpack eval` run: accuracy and C over the selected rows (a failed request scores 0)."""

    api_base: str
    model: str
    total: int  # rows selected (--rows, else every row of --data)
    scored: int
    failed: int  # requests that failed: the run is incomplete, run it again to resend them
    complete: bool
    ori_accuracy: float
    overall_accuracy: float
    c_factor: float  # the platform's C: 1 above the full-credit line
    per_task: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    retried: int = 0
    output: Optional[Path] = None  # the result JSON written (-o), or None
    report: Dict[str, Any] = field(default_factory=dict, repr=False)  # the whole document, rows included

    @classmethod
    def from_report(cls, report: Dict[str, Any], output: Optional[Path] = None) -> "EvalResult":
        return cls(api_base=report["api_base"], model=report.get("model", ""), total=report["total"],
                   scored=report["scored"], failed=report["failed"], complete=report["complete"],
                   ori_accuracy=report["ori_accuracy"], overall_accuracy=report["overall_accuracy"],
                   c_factor=report["c_factor"], per_task=report.get("per_task", {}), retried=report.get("retried", 0),
                   output=output, report=report)

    @property
    def rows(self) -> List[Dict[str, Any]]:
        """Every scored row: its question's hash, gold, prediction, score, error."""
        return list(self.report.get("rows", []))

    def gate(self):
        """soarpack.measure.scoring.Gate: ori, its margin to the full-credit line and 95 % interval."""
        from soarpack.measure.compare import eval_gate

        return eval_gate(self.report)

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.report)


@dataclass
class BenchTier:
    """One speed tier (s1, s8, smax) as bench_serving measures it."""

    concurrency: Optional[int]
    num_requests: int
    completed: int
    failed: int
    short_outputs: int  # requests that streamed fewer tokens than asked: score refuses the tier
    duration_s: float  # what the score's S is computed from
    output_throughput: float
    metrics: Dict[str, Any] = field(default_factory=dict, repr=False)  # every field of the tier

    @classmethod
    def from_dict(cls, tier: Dict[str, Any]) -> "BenchTier":
        return cls(concurrency=tier.get("concurrency"), num_requests=tier["num_requests"], completed=tier["completed"],
                   failed=tier["failed"], short_outputs=tier["short_outputs"], duration_s=tier["duration_s"],
                   output_throughput=tier["output_throughput"], metrics=tier)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.short_outputs and not self.metrics.get("long_outputs")


@dataclass
class BenchResult:
    """One `soarpack bench` run: the tiers that had speed data."""

    api_base: str
    model: str
    seed: int
    tiers: Dict[str, BenchTier] = field(default_factory=dict)
    output: Optional[Path] = None
    report: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_report(cls, report: Dict[str, Any], output: Optional[Path] = None) -> "BenchResult":
        return cls(api_base=report["api_base"], model=report.get("model", ""), seed=report["seed"],
                   tiers={name: BenchTier.from_dict(t) for name, t in report["tiers"].items()}, output=output,
                   report=report)

    @property
    def complete(self) -> bool:
        """Every tier finished without failed or short requests (else score refuses it)."""
        return all(t.ok for t in self.tiers.values())

    def to_dict(self) -> Dict[str, Any]:
        return dict(self.report)


@dataclass
class ScoreResult:
    """The competition's final score: (0.4 S1 + 0.3 S8 + 0.3 Smax) x C, S = 100 x best / ours."""

    ours_s: Dict[str, float]
    best_s: Dict[str, float]
    tier_scores: Dict[str, float]
    speed_score: float
    overall_accuracy: Optional[float]
    c_factor: float
    c_assumed: bool  # no eval given: C = 1 was assumed
    final_score: float
    capped: List[str] = field(default_factory=list)  # tiers whose best time was slower than ours: S capped at 100
    notes: List[str] = field(default_factory=list)  # what the score had to decide (a capped tier), one line each

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class CompareResult:
    """Runs side by side (soarpack.measure.compare.Run each), with the best times their S is relative to."""

    runs: List[Any]
    best_s: Dict[str, float]

    @property
    def below_gate(self) -> List[str]:
        return [r.name for r in self.runs if r.below_gate]

    @property
    def at_risk(self) -> List[str]:
        return [r.name for r in self.runs if r.at_risk]

    def render(self, style: str = "table") -> str:
        """The comparison as `table` (aligned text), `md`, `csv` or `json`: what `soarpack compare` prints."""
        from soarpack.measure.compare import render

        return render(self.runs, style, self.best_s)

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(self.render("json"))
