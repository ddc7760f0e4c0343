"""Correctness scoring exactly as the platform's `eval_model.py` does it (SALA.md §2).

Kept byte-for-byte faithful on purpose, quirks included: `final` is stripped only when a `</think>` exists,
the `\\boxed{...}` patterns are case-sensitive while the `ANSWER:` one is not, and tasks outside the known five
are matched against the raw prediction.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple

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
    """The competition's accuracy multiplier, a step function of overall (soarpack.facts.scoring.C_STEPS)."""
    for bound, c in platform_scoring.C_STEPS:
        if overall <= bound:
            return c
    return platform_scoring.C_FULL
