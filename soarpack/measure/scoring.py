"""Correctness scoring exactly as the platform's `eval_model.py` does it (SALA.md §2).

Kept byte-for-byte faithful on purpose, quirks included: `final` is stripped only when a `</think>` exists,
the `\\boxed{...}` patterns are case-sensitive while the `ANSWER:` one is not, and tasks outside the known five
are matched against the raw prediction.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from soarpack.facts import scoring as platform_scoring

MCQ_TASKS = frozenset({"mcq"})
ANY_HIT_TASKS = frozenset({"niah", "qa", "lcx"})
FRACTION_TASKS = frozenset({"cwe", "fwe"})

_MCQ_PATTERNS = (
    re.compile(r"(?i)ANSWER\s*:\s*([A-D])"),
    re.compile(r"\\boxed\{\\text\{([A-D])\}\}"),
    re.compile(r"\\boxed\{([A-D])\}"),
)

# The gate: the platform divides ori_accuracy by this baseline and caps at 100 (soarpack.facts.scoring).
BASELINE_ACCURACY = platform_scoring.BASELINE_ACCURACY


def final_answer(prediction: str) -> str:
    """Text after the last `</think>`, stripped; the whole prediction, unstripped, when there is none."""
    parts = prediction.split("</think>")
    return parts[-1].strip() if len(parts) > 1 else prediction


def extract_mcq(text: str) -> Optional[str]:
    """The first choice letter found by the platform's patterns, in their order; None if none matches."""
    for pattern in _MCQ_PATTERNS:
        match = pattern.search(text)
        if match:
            return match.group(1).upper()
    return None


def score_prediction(task: str, prediction: str, gold: Any) -> Tuple[float, Optional[str]]:
    """Score one row; returns (score in [0, 1], extracted mcq letter or None)."""
    if not prediction or not gold:
        return 0.0, None
    if task in MCQ_TASKS:
        extracted = extract_mcq(final_answer(prediction))
        hit = extracted is not None and extracted.upper() == str(gold).upper()
        return (1.0 if hit else 0.0), extracted
    if task in ANY_HIT_TASKS or task in FRACTION_TASKS:
        final = final_answer(prediction).lower()
        golds = gold if isinstance(gold, list) else [gold]
        hits = [str(ref).lower() in final for ref in golds]
        if task in ANY_HIT_TASKS:
            return (1.0 if any(hits) else 0.0), None
        return sum(hits) / len(golds), None
    # Unknown task: the platform only scores a string gold, against the raw prediction.
    if isinstance(gold, str) and gold.lower() in prediction.lower():
        return 1.0, None
    return 0.0, None


def ori_accuracy(scores: list) -> float:
    """round(100 · mean score, 2); 0.0 for no rows."""
    return round(100.0 * sum(scores) / len(scores), 2) if scores else 0.0


def overall_accuracy(ori: float) -> float:
    """The accuracy relative to the baseline, capped: min(round(ori / BASELINE_ACCURACY · 100, 2), 100)."""
    return min(round(ori / BASELINE_ACCURACY * 100.0, 2), platform_scoring.OVERALL_CAP)


def c_factor(overall: float) -> float:
    """The competition's accuracy multiplier, a step function of overall (soarpack.facts.scoring.C_STEPS).
    A NaN compares false with every bound and would get full credit: it is refused (ValueError), as is anything
    that is not a number."""
    if isinstance(overall, bool) or not isinstance(overall, (int, float)) or math.isnan(overall):
        raise ValueError(f"overall accuracy {overall!r} is not a number")
    for bound, c in platform_scoring.C_STEPS:
        if overall <= bound:
            return c
    return platform_scoring.C_FULL


# -- the full-credit line and the uncertainty of a measured ori ------------------------------------------------

Z95 = 1.959964  # two-sided 95 % of the normal distribution


def full_credit_ori() -> float:
    """The ori_accuracy above which C = 1 (soarpack.facts.scoring.FULL_CREDIT_ORI)."""
    return platform_scoring.FULL_CREDIT_ORI


def ori_interval(scores_by_task: Dict[str, Sequence[float]]) -> Tuple[float, float]:
    """A 95 % interval for ori_accuracy (points), stratified by task: the run's tasks are strata with their row
    counts as weights, each contributing its own sample variance (normal approximation). A task of one row counts
    with the largest variance a score in [0, 1] can have (0.25); a task whose rows all scored alike adds no width,
    which understates the uncertainty of a small slice."""
    n = sum(len(s) for s in scores_by_task.values())
    if not n:
        return (0.0, 100.0)
    mean = sum(sum(s) for s in scores_by_task.values()) / n
    var = 0.0
    for scores in scores_by_task.values():
        k = len(scores)
        if not k:
            continue
        m = sum(scores) / k
        s2 = 0.25 if k == 1 else sum((x - m) ** 2 for x in scores) / (k - 1)
        var += (k / n) ** 2 * s2 / k
    half = Z95 * math.sqrt(var)
    return (round(max(0.0, 100.0 * (mean - half)), 2), round(min(100.0, 100.0 * (mean + half)), 2))


@dataclass(frozen=True)
class Gate:
    """Where a measured ori stands against the full-credit line: C, the margin, the 95 % interval."""

    ori: float
    rows: int
    low: float
    high: float
    stratified: bool  # the interval is stratified by task (else binomial over all rows)

    @property
    def line(self) -> float:
        return full_credit_ori()

    @property
    def margin(self) -> float:
        return round(self.ori - self.line, 2)

    @property
    def c(self) -> float:
        return c_factor(overall_accuracy(self.ori))

    @property
    def verdict(self) -> str:
        """`below` (the point estimate gets C < 1), `at risk` (the interval reaches the line) or `pass`."""
        if self.ori <= self.line:
            return "below"
        return "at risk" if self.low <= self.line else "pass"

    def text(self) -> str:
        how = "stratified by task" if self.stratified else "binomial, no per-task scores"
        return (f"ori {self.ori:.2f}, margin {self.margin:+.2f} points to the {self.line:g} full-credit line, "
                f"95% interval {self.low:.2f}-{self.high:.2f} ({how}, {self.rows} rows): C = {self.c:g}, "
                f"{self.verdict}")

    def to_dict(self) -> Dict[str, Any]:
        return {"ori": self.ori, "rows": self.rows, "line": self.line, "margin": self.margin, "ci95": [self.low, self.high],
                "stratified": self.stratified, "c": self.c, "verdict": self.verdict}


def gate_of_records(records: Iterable[Dict[str, Any]]) -> Gate:
    """The gate of scored eval rows ({task, score} each), as ori_accuracy computes it."""
    by_task: Dict[str, List[float]] = {}
    for r in records:
        by_task.setdefault(str(r["task"]), []).append(float(r["score"]))
    scores = [x for s in by_task.values() for x in s]
    low, high = ori_interval(by_task)
    return Gate(ori_accuracy(scores), len(scores), low, high, True)


def gate_of_total(ori: float, rows: int) -> Gate:
    """The gate when only ori and the row count are known: a binomial interval over all rows."""
    p = min(max(ori / 100.0, 0.0), 1.0)
    half = 100.0 * Z95 * math.sqrt(p * (1 - p) / rows) if rows else 100.0
    return Gate(ori, rows, round(max(0.0, ori - half), 2), round(min(100.0, ori + half), 2), False)


def gate_line(ori: float, rows: int, records: Optional[Sequence[dict]] = None) -> str:
    """C, the margin to the cliff in points and the 95 % interval of a slice of `rows` rows: stratified by task
    when the scored `records` are given, else binomial (Gate)."""
    gate = gate_of_records(records) if records else gate_of_total(ori, rows)
    how = "stratified by task" if gate.stratified else "binomial"
    return (f"expected C = {c_factor(overall_accuracy(ori))}: ori_accuracy {ori:.2f}, margin {ori - gate.line:+.2f} "
            f"points to the {gate.line:g} cliff (95% interval {gate.low:.2f}-{gate.high:.2f}, {how}, {gate.rows} rows: "
            f"{gate.verdict}; identical BF16 runs vary by 2-3 points)")
