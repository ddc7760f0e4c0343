"""The competition's final score (SALA.md §2): (0.4·S1 + 0.3·S8 + 0.3·Smax) × C, S_tier = 100 × best / ours."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, Optional

from soarpack.bench.evaluate import EVAL_KIND
from soarpack.bench.scoring import c_factor
from soarpack.bench.speed import BENCH_KIND
from soarpack.errors import InputDataError
from soarpack.facts import scoring as platform_scoring
from soarpack.inputs import MAX_RESULT_BYTES, read_bytes_capped

TIER_WEIGHTS: Dict[str, float] = platform_scoring.TIER_WEIGHTS
# What a best time is and where it comes from (SALA.md §2): soarpack knows no current value, so it never assumes one.
BEST_TIME_MEANS = ("a tier's best time is the shortest benchmark duration any team has on the competition's "
                   "leaderboard (S = 100 x best / ours)")
BEST_TIME_FROM = ("read each tier's best duration off the leaderboard (the board was re-scored when the hidden "
                  "speed set changed, so take today's figures)")


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
        try:
            durations[name] = float(tier["duration_s"])
        except (KeyError, TypeError, ValueError):
            raise InputDataError(f"{path}: tier {name} has no duration_s", "pass the -o file of `soarpack bench`") from None
    return durations


def overall_from_eval(path: Path) -> float:
    """overall_accuracy of a complete `soarpack eval` JSON."""
    data = read_result(path, EVAL_KIND, "eval")
    if not data.get("complete"):
        raise InputDataError(f"{path} is incomplete: {data.get('scored')} of {data.get('total')} rows scored, "
                             f"{data.get('failed', 0)} of them failed requests",
                             "finish it: run the same soarpack eval again, it resumes")
    return float(data["overall_accuracy"])


def tier_score(best_s: float, ours_s: float) -> float:
    """S of one tier: 100 × best / ours (100 when ours is the best)."""
    return round(100.0 * best_s / ours_s, 4)


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
        bad = [t for t in TIER_WEIGHTS if not (math.isfinite(values[t]) and values[t] > 0)]
        if bad:
            raise InputDataError(f"{side} duration for {', '.join(bad)} is not a positive finite number",
                                 "durations are seconds > 0")
    tiers = {t: tier_score(best[t], ours[t]) for t in TIER_WEIGHTS}
    speed = sum(TIER_WEIGHTS[t] * tiers[t] for t in TIER_WEIGHTS)
    c = 1.0 if overall is None else c_factor(overall)
    return {
        "ours_s": {t: ours[t] for t in TIER_WEIGHTS},
        "best_s": {t: best[t] for t in TIER_WEIGHTS},
        "tier_scores": tiers,
        "speed_score": round(speed, 4),
        "overall_accuracy": overall,
        "c_factor": c,
        "c_assumed": overall is None,
        "final_score": round(speed * c, 4),
    }
