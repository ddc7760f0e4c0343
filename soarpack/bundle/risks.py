"""The risks a verdict knows about a bundle's score, each one line with its evidence.

Computed from what `soarpack build` recorded in MANIFEST.json: the recipe's and the profile's `[[evidence]]`
(`evidence`) and where the calibration rows come from (`quantize.calibration`). build, check and inspect call
`manifest_risks`; `verdict` turns the rehearsal's outcome and the risks into the one line check ends with.

    recipe-below-gate, profile-below-gate   a measured ori at or below the full-credit line: C < 1 (blocks
                                            an upload in `check` unless --accept-risk NAME)
    recipe-flagged, profile-flagged         an evidence entry says why it is risky
    calib-short                             fewer calibration rows shipped than the recipe asks for
    calib-builtin                           the built-in synthetic prompts as calibration
    calib-tasks                             task-carrying rows that cover fewer than 3 of the 5 public tasks
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from soarpack.measure.scoring import c_factor, full_credit_ori, overall_accuracy
from soarpack.errors import ConfigError
from soarpack.evidence import Evidence
from soarpack.quant.calibinfo import MIN_PUBLIC_TASKS, PUBLIC_TASKS, public_tasks_covered, where_from
from soarpack.steps import Risk

RISK_NAMES = ("recipe-below-gate", "profile-below-gate", "recipe-flagged", "profile-flagged", "calib-short",
              "calib-builtin", "calib-tasks")
CALIBRATION_SOURCE = "docs/evidence.md#calibration"


def _c_text(low: float, high: float) -> str:
    """`C = 0.92 (overall 97.88)`, or the ends of a range."""
    def one(ori: float) -> Tuple[float, float]:
        overall = overall_accuracy(ori)
        return c_factor(overall), overall

    (c_low, o_low), (c_high, o_high) = one(low), one(high)
    name = lambda c: f"{c:g}" + (" (elimination)" if c == 0 else "")  # noqa: E731
    if low == high:
        return f"C = {name(c_high)} (overall {o_high:.2f})"
    if c_low == c_high:
        return f"C = {name(c_high)} (overall {o_low:.2f}-{o_high:.2f})"
    return f"C = {c_low:g} to {c_high:g} (overall {o_low:.2f}-{o_high:.2f})"


def below_gate(what: str, name: str, evidence: Sequence[Evidence]) -> Optional[Risk]:
    """The lowest measured ori of this recipe or profile, when it is at or below the full-credit line."""
    line = full_credit_ori()
    measured = [(e.acc_range, e) for e in evidence if e.relation == "this" and e.acc_range is not None]
    below = [(r, e) for r, e in measured if r[0] <= line]
    if not below:
        return None
    (low, high), entry = min(below, key=lambda item: item[0][0])
    shown = f"{low:g}-{high:g}" if low != high else f"{high:g}"
    who = "peers measured" if entry.kind == "platform" else "soarpack measured"
    best = c_factor(overall_accuracy(high))
    outcome = "the score would be 0" if best == 0 else f"the score x {best:g} at best"
    return Risk(f"{what}-below-gate",
                f"{what} {name}: {who} ori {shown}, at or below the {line:g} full-credit line: {_c_text(low, high)}, "
                f"{outcome}", entry.source, blocks=True)


def flagged(what: str, name: str, evidence: Sequence[Evidence]) -> List[Risk]:
    return [Risk(f"{what}-flagged", f"{what} {name}: {e.risk}", e.source) for e in evidence if e.risk]


def calibration_risks(calibration: Dict[str, Any]) -> List[Risk]:
    """From MANIFEST quantize.calibration: {rows_asked, asked_by, builtin, sources: [{file, rows, tasks}]}."""
    out = []
    sources = calibration.get("sources") or []
    builtin = bool(calibration.get("builtin"))
    asked = calibration.get("rows_asked")
    shipped = sum(int(s.get("rows", 0)) for s in sources)
    if builtin:
        out.append(Risk("calib-builtin", "calibration is soarpack's built-in synthetic prompts (5 sentence templates "
                        "over 150 nouns); nobody has measured the real model's accuracy after calibrating on them; "
                        "calibrate on real text, e.g. --calib perf_public_set.jsonl (README)", CALIBRATION_SOURCE))
    if isinstance(asked, int) and shipped < asked:
        by = {"recipe": "the recipe asks for", "default": "soarpack's default asks for",
              "cli": "build --rows asks for"}.get(
            str(calibration.get("asked_by")), "asked for")
        out.append(Risk("calib-short", f"{shipped} calibration rows shipped ({where_from(sources, builtin)}) against "
                        f"the {asked} {by}: quantize will calibrate on at most {shipped}", CALIBRATION_SOURCE))
    covered = public_tasks_covered(sources)
    if not builtin and covered is not None and len(covered) < MIN_PUBLIC_TASKS:
        out.append(Risk("calib-tasks", f"the calibration rows that carry a task cover {len(covered)} of the "
                        f"{len(PUBLIC_TASKS)} public tasks ({', '.join(covered) or 'none'}; the set scores "
                        f"{', '.join(PUBLIC_TASKS)})", CALIBRATION_SOURCE))
    return out


def risks_of(recipe: str, recipe_evidence: Sequence[Evidence], profile: str, profile_evidence: Sequence[Evidence],
             calibration: Optional[Dict[str, Any]]) -> List[Risk]:
    out: List[Risk] = []
    for what, name, evidence in (("recipe", recipe, recipe_evidence), ("profile", profile, profile_evidence)):
        risk = below_gate(what, name, evidence)
        if risk:
            out.append(risk)
        out += flagged(what, name, evidence)
    return out + calibration_risks(calibration or {})


def _evidence(entries: Any) -> List[Evidence]:
    return [Evidence.model_validate(e) for e in entries or [] if isinstance(e, dict)]


def evidence_record(recipe: Any, profile: Any) -> Dict[str, Any]:
    """What MANIFEST.json `evidence` holds: both lists, as the recipe and profile files state them."""
    return {"recipe": [e.model_dump() for e in getattr(recipe, "evidence", ())],
            "profile": [e.model_dump() for e in getattr(profile, "evidence", ())]}


def _builtin_evidence(what: str, name: str) -> List[Evidence]:
    """This soarpack's evidence for a built-in recipe or profile by name; none for any other name."""
    from soarpack.recipe.model import list_recipes, load_recipe
    from soarpack.recipe.profile import list_profiles, load_profile

    if what == "recipe":
        return list(load_recipe(name).evidence) if name in list_recipes() else []
    return list(load_profile(name).evidence) if name in list_profiles() else []


def evidence_risk_lines(profile: Optional[str], recipe: Optional[str]) -> List[str]:
    """The risk lines this soarpack's evidence gives a built-in profile and recipe (none for other names): what
    `compare` shows under a run whose result names its bundle."""
    if not profile and not recipe:
        return []
    recipe_ev = _builtin_evidence("recipe", recipe) if recipe else []
    profile_ev = _builtin_evidence("profile", profile) if profile else []
    return [r.line() for r in risks_of(str(recipe), recipe_ev, str(profile), profile_ev, None)]


def manifest_risks(manifest: Any) -> List[Risk]:
    """The risks of a bundle from its MANIFEST.json (parsed, or the typed soarpack.bundle.manifest.Manifest). A
    bundle built before evidence was recorded gets this soarpack's evidence for its built-in recipe and profile
    names, and the calibration risk its file list shows."""
    if not isinstance(manifest, dict):  # a Manifest: the keys it was written with (an older one lacks `evidence`)
        manifest = manifest.as_json()
    quant = manifest.get("quantize") or {}
    recipe = str(quant.get("recipe_name") or quant.get("recipe"))
    profile = str((manifest.get("profile") or {}).get("name"))
    if "evidence" in manifest:
        evidence = manifest.get("evidence") or {}
        recipe_evidence, profile_evidence = _evidence(evidence.get("recipe")), _evidence(evidence.get("profile"))
    else:
        from soarpack.recipe.profile import recorded_profile

        recipe_evidence = _builtin_evidence("recipe", str(quant.get("recipe")))  # "recipe.toml" is a user file
        # a bundle built before a profile's rename names it by its old name ("fp8" for today's "fp8-kv")
        profile_evidence = _builtin_evidence("profile", recorded_profile(profile, (manifest.get("profile") or {}).get("args")))
    calibration = quant.get("calibration")
    if calibration is None and quant.get("calib") == ["calib/builtin.jsonl"]:
        calibration = {"builtin": True}
    return risks_of(recipe, recipe_evidence, profile, profile_evidence, calibration)


def check_accepted(names: Iterable[str]) -> List[str]:
    """--accept-risk values: each must be a risk name (a typo would silently accept nothing)."""
    names = list(names)
    for name in names:
        if name not in RISK_NAMES:
            raise ConfigError(f"--accept-risk {name!r} is not a risk name", f"risk names: {', '.join(RISK_NAMES)}")
    return names


def blocking_risks(risks: Sequence[Risk], accepted: Iterable[str] = (), strict: bool = False) -> List[Risk]:
    """The risks that keep a bundle from being uploadable: those that block (under --strict, every one), unless
    accepted. check's gate and its verdict line both read this one rule."""
    accepted = set(accepted)
    return [r for r in risks if (r.blocks or strict) and r.name not in accepted]


def verdict(not_uploadable_because: Optional[str], risks: Sequence[Risk], accepted: Iterable[str] = (),
            strict: bool = False) -> Tuple[str, bool]:
    """(`uploadable`, `uploadable, 2 risks: a, b` or `NOT uploadable (why)`, whether that is an upload)."""
    accepted = set(accepted)
    names = [r.name + (" (accepted)" if r.name in accepted else "") for r in risks]
    counted = f"{len(risks)} risk{'s' if len(risks) != 1 else ''}: {', '.join(names)}"
    if not_uploadable_because is not None:
        return f"NOT uploadable ({not_uploadable_because})" + (f"; {counted}" if risks else ""), False
    blocking = blocking_risks(risks, accepted)
    if blocking:
        return (f"NOT uploadable ({', '.join(r.name for r in blocking)}: full credit unlikely; pass --accept-risk "
                f"{blocking[0].name} to upload anyway); {counted}"), False
    if strict and blocking_risks(risks, accepted, strict=True):
        return f"NOT uploadable (--strict and {counted})", False
    return ("uploadable" + (f", {counted}" if risks else "")), True
