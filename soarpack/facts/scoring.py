"""The competition's scoring (SALA.md §2): the baseline, the accuracy multiplier C, the speed tiers' weights.

overall = min(round(ori / BASELINE · 100, 2), 100); C is a step function of overall. The ori_accuracy lines below
are derived from the two, never typed: above `FULL_CREDIT_ORI` C = 1, at or below `NO_CREDIT_ORI` C = 0.
"""

from typing import Dict, Tuple

BASELINE_ACCURACY = 80.0  # ori_accuracy points that count as 100 overall
OVERALL_CAP = 100.0
# (overall upper bound, C for overall at or below it), ascending; above the last bound C = C_FULL.
C_STEPS: Tuple[Tuple[float, float], ...] = ((97.0, 0.0), (98.0, 0.92), (99.0, 0.96))
C_FULL = 1.0
TIER_WEIGHTS: Dict[str, float] = {"s1": 0.4, "s8": 0.3, "smax": 0.3}


def ori_line(overall: float) -> float:
    """The ori_accuracy that gives this overall accuracy."""
    return round(overall * BASELINE_ACCURACY / 100.0, 4)


FULL_CREDIT_ORI = ori_line(C_STEPS[-1][0])  # C = 1 needs ori above it
NO_CREDIT_ORI = ori_line(C_STEPS[0][0])  # C = 0 at or below it
C_ORI_LINES: Tuple[Tuple[float, float], ...] = tuple((ori_line(bound), c) for bound, c in C_STEPS)


def c_steps_words() -> str:
    """'≤97 → 0, (97, 98] → 0.92, (98, 99] → 0.96, >99 → 1' for help texts."""
    parts, low = [], None
    for bound, c in C_STEPS:
        parts.append(f"≤{bound:g} → {c:g}" if low is None else f"({low:g}, {bound:g}] → {c:g}")
        low = bound
    return ", ".join(parts + [f">{low:g} → {C_FULL:g}"])
