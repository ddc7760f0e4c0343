"""The competition's final score (SALA.md §2): (0.4·S1 + 0.3·S8 + 0.3·Smax) × C, S_tier = 100 × best / ours.

A tier's best time is the fastest on the leaderboard, and the leaderboard holds ours once we submit: a best time
slower than ours means ours would be the best, so S is 100 there, never more (`tier_score` caps it and
`final_score` says which tiers it capped). Result files are read as soarpack wrote them: a duration, an accuracy
or a row score that is not a finite number in its range is refused with the file and the field, never scored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from soarpack.measure.evaluate import EVAL_KIND
from soarpack.measure.scoring import c_factor, overall_accuracy
from soarpack.measure.speed import BENCH_KIND
from soarpack.errors import InputDataError
from soarpack.facts import scoring as platform_scoring
from soarpack.inputs import MAX_RESULT_BYTES, read_bytes_capped

TIER_WEIGHTS: Dict[str, float] = platform_scoring.TIER_WEIGHTS
# What a best time is and where it comes from (SALA.md §2): soarpack knows no current value, so it never assumes one.
BEST_TIME_MEANS = ("a tier's best time is the shortest benchmark duration any team has on the competition's "
                   "leaderboard (S = 100 x best / ours)")
BEST_TIME_FROM = ("read each tier's best duration off the leaderboard (the board was re-scored when the hidden "
                  "speed set changed, so take today's figures)")
# No bench tier over HTTP ends within a microsecond: a shorter duration is a damaged or hand-made number (a
# subnormal one would make S infinite).
MIN_DURATION_S = 1e-6
DAMAGED = "pass the -o file of `soarpack {what}` as it wrote it (a hand-edited or damaged result cannot be scored)"


def read_result(path: Path, kind: str, what: str) -> dict:
    try:
        data = json.loads(read_bytes_capped(path, f"{what} file", MAX_RESULT_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise InputDataError(f"{what} file {path} does not exist", "check the path") from None
    except OSError as exc:
        raise InputDataError(f"{what} file {path} cannot be read ({exc.strerror or exc})", "check the path") from None
    except UnicodeDecodeError:
        raise InputDataError(f"{path} is not JSON (not UTF-8 text)", f"pass the JSON that soarpack {what} wrote") from None
    except json.JSONDecodeError as exc:
        raise InputDataError(f"{path} is not JSON ({exc.msg} at line {exc.lineno})", f"pass the JSON that soarpack {what} wrote") from None
    except RecursionError:  # JSON nested deeper than Python's parser recurses: no result of ours
        raise InputDataError(f"{path} is not a soarpack {what} result (JSON nested too deep to read)",
                             f"pass the -o file of `soarpack {what}`") from None
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise InputDataError(f"{path} is not a soarpack {what} result", f"pass the -o file of `soarpack {what}`")
    return data


def durations_from_bench(path: Path) -> Dict[str, float]:
    """Tier → duration (s) from a `soarpack bench` JSON; tiers with failed or short requests are refused."""
    data = read_result(path, BENCH_KIND, "bench")
    tiers = data.get("tiers")
    if not isinstance(tiers, dict) or not all(isinstance(t, dict) for t in tiers.values()):
        raise InputDataError(f"{path} holds no tiers", "pass the -o file of `soarpack bench`")
    durations = {}
    for name, tier in tiers.items():
        if tier.get("failed"):
            raise InputDataError(f"{path}: tier {name} had {tier['failed']} failed request(s)",
                                 "its duration is not comparable; rerun the bench")
        if tier.get("short_outputs"):
            # With ignore_eos the platform always gets the asked length: a shorter stream did less work, faster.
            raise InputDataError(f"{path}: tier {name} had {tier['short_outputs']} request(s) that streamed fewer tokens "
                                 f"than asked (e.g. {', '.join(tier.get('short_examples', [])[:3])})",
                                 "its duration is not comparable; does the server honour ignore_eos and max_new_tokens?")
        if tier.get("long_outputs"):
            raise InputDataError(f"{path}: tier {name} had {tier['long_outputs']} request(s) whose server claimed more "
                                 f"tokens than asked (e.g. {', '.join(tier.get('long_examples', [])[:3])})",
                                 "its duration is not comparable; does the server honour max_new_tokens?")
        if "duration_s" not in tier:
            raise InputDataError(f"{path}: tier {name} has no duration_s", "pass the -o file of `soarpack bench`")
        durations[name] = checked_duration(tier["duration_s"], f"{path}: tier {name} duration_s",
                                           DAMAGED.format(what="bench"))
    return durations


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def is_number(value: Any) -> bool:
    """A JSON number (int or float, never a bool) that is finite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def checked_number(value: Any, what: str, low: float, high: float, hint: str) -> float:
    """`value` as a float when it is a finite number in [low, high]; else one line naming `what` and the value."""
    if not is_number(value) or not low <= value <= high:
        raise InputDataError(f"{what} is {_shown(value)}, not a number from {low:g} to {high:g}", hint)
    return float(value)


def checked_duration(value: Any, what: str, hint: str = "durations are seconds > 0") -> float:
    """A duration in seconds: a finite number of at least MIN_DURATION_S."""
    if not is_number(value) or value < MIN_DURATION_S:
        raise InputDataError(f"{what} is not a positive finite number ({_shown(value)}; a duration is seconds, at "
                             f"least {MIN_DURATION_S:g})", hint)
    return float(value)


def eval_accuracies(data: dict, path: Path) -> Tuple[float, Optional[float]]:
    """(overall_accuracy, ori_accuracy or None) of an eval result, each a finite number in [0, 100] and the two
    agreeing as the platform derives one from the other; a file that breaks any of that is refused."""
    hint = DAMAGED.format(what="eval")
    if "overall_accuracy" not in data:
        raise InputDataError(f"{path} has no overall_accuracy", hint)
    overall = checked_number(data["overall_accuracy"], f"{path}: overall_accuracy", 0.0, 100.0, hint)
    ori = None
    if "ori_accuracy" in data:
        ori = checked_number(data["ori_accuracy"], f"{path}: ori_accuracy", 0.0, 100.0, hint)
        if abs(overall_accuracy(ori) - overall) > 0.011:  # both are rounded to 2 decimals
            raise InputDataError(f"{path}: overall_accuracy {overall:g} is not what ori_accuracy {ori:g} gives "
                                 f"({overall_accuracy(ori):g})", hint)
    return overall, ori


def overall_from_eval(path: Path) -> float:
    """overall_accuracy of a complete `soarpack eval` JSON."""
    data = read_result(path, EVAL_KIND, "eval")
    if data.get("complete") is not True:
        raise InputDataError(f"{path} is incomplete: {_shown(data.get('scored'))} of {_shown(data.get('total'))} rows "
                             f"scored, {_shown(data.get('failed', 0))} of them failed requests",
                             "finish it: run the same soarpack eval again, it resumes")
    return eval_accuracies(data, path)[0]


def tier_score(best_s: float, ours_s: float) -> float:
    """S of one tier: 100 × best / ours, at most 100: the leaderboard's best includes ours, so a best time slower
    than ours means ours is the best."""
    return round(min(100.0, 100.0 * best_s / ours_s), 4)


def capped_tiers(ours: Dict[str, float], best: Dict[str, float]) -> List[str]:
    """The tiers whose given best time is slower than ours (S capped at 100)."""
    return [t for t in TIER_WEIGHTS if t in ours and t in best and best[t] > ours[t]]


def capped_note(tiers: Sequence[str], ours: Dict[str, float], best: Dict[str, float]) -> str:
    """One line saying which tiers' S was capped at 100, and why."""
    each = ", ".join(f"{t} ours {ours[t]:.6g} s < best {best[t]:.6g} s" for t in tiers)
    return (f"S capped at 100 for {', '.join(tiers)}: our time beats the best time given ({each}); the "
            "leaderboard's best includes ours, so there ours would be the best (check the best times if that is "
            "not expected)")


def final_score(ours: Dict[str, float], best: Dict[str, float], overall: Optional[float]) -> dict:
    """Per-tier S, the weighted speed score, C and the final score; C is taken as 1 when `overall` is None."""
    missing_best = [t for t in TIER_WEIGHTS if t not in best]
    if missing_best:
        flags = " ".join(f"--best-{t} SECONDS" for t in missing_best)
        raise InputDataError(f"the best time is missing for {', '.join(missing_best)}: {BEST_TIME_MEANS}",
                             f"{BEST_TIME_FROM}; pass {flags}, or --best BENCH.json to score against a bench "
                             "of your own (all three tiers)")
    missing_ours = [t for t in TIER_WEIGHTS if t not in ours]
    if missing_ours:
        raise InputDataError(f"our bench has no {', '.join(missing_ours)} tier",
                             "bench all three tiers: soarpack bench --s1 F --s8 F --smax F")
    for side, values in (("ours", ours), ("best", best)):
        for t in TIER_WEIGHTS:
            checked_duration(values[t], f"{side} duration for {t}")
    if overall is not None:
        overall = checked_number(overall, "overall_accuracy", 0.0, 100.0, "an accuracy is a number from 0 to 100")
    tiers = {t: tier_score(best[t], ours[t]) for t in TIER_WEIGHTS}
    speed = sum(TIER_WEIGHTS[t] * tiers[t] for t in TIER_WEIGHTS)
    c = 1.0 if overall is None else c_factor(overall)
    capped = capped_tiers(ours, best)
    return {
        "ours_s": {t: ours[t] for t in TIER_WEIGHTS},
        "best_s": {t: best[t] for t in TIER_WEIGHTS},
        "tier_scores": tiers,
        "speed_score": round(speed, 4),
        "overall_accuracy": overall,
        "c_factor": c,
        "c_assumed": overall is None,
        "final_score": round(speed * c, 4),
        "capped": capped,
        "notes": [capped_note(capped, ours, best)] if capped else [],
    }
