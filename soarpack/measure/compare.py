"""`soarpack compare`: eval and bench results of several runs side by side, against the gate.

Files are grouped into runs by their label (`--label` of eval/bench), else by the served model id. Speed scores
are relative: S = 100 × best / ours with `best` the fastest of the compared runs per tier (or the given best
times), so the fastest run scores 100 (and no run more: a given best slower than a run caps its S at 100, with a
note). A run is below the gate when its eval says C < 1 or is incomplete; it is `at risk` when its ori passes but
the 95 % interval of its ori (stratified by task, bench.scoring.Gate) reaches the full-credit line
(soarpack.facts.scoring).

Each result records what it measured (its `measured` block: the served model's id and path, the bundle). Files
joined under one label that measured different servers, models or bundles are still joined (the label is the
user's word), but the run carries a note saying what differs, and every table shows it.

A run whose results name their bundle (eval/bench --bundle) also carries the risks this soarpack's evidence gives
its built-in profile and recipe (soarpack.bundle.risks: the FP8 profiles' unmeasured accuracy, a recipe measured
below the gate), printed under the table.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from soarpack.measure.competition import (DAMAGED, TIER_WEIGHTS, capped_note, capped_tiers, checked_duration,
                                        checked_number, durations_from_bench, eval_accuracies, read_result,
                                        tier_score)
from soarpack.measure.evaluate import EVAL_KIND
from soarpack.measure.scoring import Gate, c_factor, gate_of_records, gate_of_total
from soarpack.measure.speed import BENCH_KIND
from soarpack.errors import InputDataError
from soarpack.inputs import MAX_RESULT_BYTES, read_bytes_capped

TIERS = tuple(TIER_WEIGHTS)


@dataclass
class Run:
    name: str
    files: List[str] = field(default_factory=list)
    accuracy: Optional[float] = None  # overall_accuracy of the eval
    gate: Optional[Gate] = None  # ori_accuracy, its margin to the full-credit line and 95 % interval
    c: Optional[float] = None
    eval_complete: Optional[bool] = None
    per_task: Dict[str, float] = field(default_factory=dict)
    durations: Dict[str, float] = field(default_factory=dict)
    scores: Dict[str, float] = field(default_factory=dict)
    final: Optional[float] = None
    profile: Optional[str] = None  # the bundle's profile and recipe, when the results name their bundle
    recipe: Optional[str] = None
    risks: List[str] = field(default_factory=list)  # soarpack.bundle.risks lines for that profile and recipe
    measured: Dict[str, dict] = field(default_factory=dict, repr=False)  # file -> what it measured (provenance)
    notes: List[str] = field(default_factory=list)  # files that measured different things, capped tiers

    @property
    def below_gate(self) -> bool:
        return self.eval_complete is False or (self.c is not None and self.c < 1.0)

    @property
    def at_risk(self) -> bool:
        """Passes on its point estimate, but the 95 % interval's lower bound is at or below the line."""
        return not self.below_gate and self.gate is not None and self.gate.verdict == "at risk"


def _kind(path: Path) -> str:
    try:
        data = json.loads(read_bytes_capped(path, "result file", MAX_RESULT_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise InputDataError(f"{path} does not exist", "pass the -o files of soarpack eval and bench") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        raise InputDataError(f"{path} is not a JSON result", "pass the -o files of soarpack eval and bench") from None
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in (EVAL_KIND, BENCH_KIND):
        raise InputDataError(f"{path} is neither a soarpack eval nor a bench result", "pass the -o files of soarpack eval and bench")
    return kind


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and value else None


def _run_name(data: dict, path: Path) -> str:
    measured = data.get("measured") if isinstance(data.get("measured"), dict) else {}
    return _text(measured.get("label")) or _text(data.get("model")) or path.stem


# What a result says it measured, as provenance.measured records it: (key, words) in the order a note names them.
PROVENANCE = (("server", "server"), ("model", "served model"), ("model_path", "model path"), ("bundle", "bundle"))


def provenance(data: dict) -> Dict[str, Optional[str]]:
    """What one result measured: the server (api_base), the served model's id and path, the bundle's id (None
    where the file does not say)."""
    measured = data.get("measured") if isinstance(data.get("measured"), dict) else {}
    served = measured.get("served_model") if isinstance(measured.get("served_model"), dict) else {}
    bundle = measured.get("bundle") if isinstance(measured.get("bundle"), dict) else {}
    api = _text(data.get("api_base"))
    return {"server": api.rstrip("/") if api else None, "model": _text(served.get("id")) or _text(data.get("model")),
            "model_path": _text(served.get("root")), "bundle": _text(bundle.get("id")) or _text(bundle.get("sha256"))}


def join_notes(run: Run) -> List[str]:
    """One line per thing the run's files measured differently (only where each of two files says what it was)."""
    notes = []
    for key, words in PROVENANCE:
        said = {f: m[key] for f, m in run.measured.items() if m.get(key)}
        if len(set(said.values())) > 1:
            each = "; ".join(f"{Path(f).name}: {v}" for f, v in said.items())
            notes.append(f"run {run.name!r} joins results of different {words}s ({each}): its accuracy and its "
                         "speed may not be one setup's")
    return notes


def load_runs(paths: Sequence[Path],
              risks: Optional[Callable[[Optional[str], Optional[str]], List[str]]] = None) -> List[Run]:
    """One Run per label (or served model), in the order of first appearance; each run notes what its files
    measured differently (join_notes)."""
    runs: Dict[str, Run] = {}
    for path in map(Path, paths):
        kind = _kind(path)
        what = "eval" if kind == EVAL_KIND else "bench"
        data = read_result(path, kind, what)
        run = runs.setdefault(_run_name(data, path), Run(_run_name(data, path)))
        if kind == EVAL_KIND:
            if run.accuracy is not None:
                raise InputDataError(f"two eval results for run {run.name!r}: {run.files} and {path}",
                                     "give each run its own --label, or pass one eval per run")
            run.accuracy, _ = eval_accuracies(data, path)
            run.c = c_factor(run.accuracy)
            run.eval_complete = data.get("complete") is True
            run.per_task = per_task_accuracies(data, path)
            run.gate = eval_gate(data, path)
        else:
            durations = durations_from_bench(path)
            if set(durations) & set(run.durations):
                raise InputDataError(f"run {run.name!r} has tier(s) {sorted(set(durations) & set(run.durations))} twice "
                                     f"({run.files} and {path})", "give each run its own --label")
            run.durations.update(durations)
        measured = data.get("measured") if isinstance(data.get("measured"), dict) else {}
        bundle = measured.get("bundle") if isinstance(measured.get("bundle"), dict) else {}
        run.profile = run.profile or bundle.get("profile")
        run.recipe = run.recipe or bundle.get("recipe")
        run.files.append(str(path))
        run.measured[str(path)] = provenance(data)
    for run in runs.values():
        run.notes += join_notes(run)
        # The risk lines of the run's profile and recipe come from the layer above (bundle.risks): passed in.
        run.risks = risks(run.profile, run.recipe) if risks is not None else []
    return list(runs.values())


def per_task_accuracies(data: dict, path: Path) -> Dict[str, float]:
    per_task = data.get("per_task") or {}
    if not isinstance(per_task, dict) or not all(isinstance(b, dict) for b in per_task.values()):
        raise InputDataError(f"{path}: per_task is not a table of tasks", DAMAGED.format(what="eval"))
    return {str(task): checked_number(b.get("accuracy"), f"{path}: per_task {task} accuracy", 0.0, 100.0,
                                      DAMAGED.format(what="eval")) for task, b in per_task.items()}


def eval_gate(data: dict, path: Any = "the eval result") -> Gate:

    """The gate of an eval result: from its scored rows of the selection (index < total), stratified by task; from
    its ori and row count when the file holds no rows. A row score that is not a number in [0, 1] is refused."""
    hint = DAMAGED.format(what="eval")
    total = data.get("total", 0)
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
        raise InputDataError(f"{path}: total is {total!r}, not a row count", hint)
    records = [r for r in data.get("rows") or [] if isinstance(r, dict) and isinstance(r.get("index"), int)
               and not isinstance(r.get("index"), bool) and r["index"] < total and "task" in r and "score" in r]
    if records:
        return gate_of_records([{"task": r["task"], "score": checked_number(
            r["score"], f"{path}: row {r['index']} score", 0.0, 1.0, hint)} for r in records])
    if "ori_accuracy" not in data:
        raise InputDataError(f"{path} has no ori_accuracy and no scored rows", hint)
    ori = checked_number(data["ori_accuracy"], f"{path}: ori_accuracy", 0.0, 100.0, hint)
    scored = data.get("scored", 0)
    if isinstance(scored, bool) or not isinstance(scored, int) or scored < 0:
        raise InputDataError(f"{path}: scored is {scored!r}, not a row count", hint)
    return gate_of_total(ori, scored)


def score_runs(runs: List[Run], best: Optional[Dict[str, float]] = None) -> Dict[str, float]:
    """Fill each run's tier scores and final score; return the best times used (given, else the fastest run's)."""
    best = {t: checked_duration(v, f"the best time for {t}") for t, v in (best or {}).items()}
    for tier in TIERS:
        times = [r.durations[tier] for r in runs if tier in r.durations]
        if tier not in best and times:
            best[tier] = min(times)
    for run in runs:
        run.scores = {t: tier_score(best[t], run.durations[t]) for t in TIERS if t in run.durations}
        capped = capped_tiers(run.durations, best)
        run.notes = [n for n in run.notes if not n.startswith("S capped")]  # scored again: a fresh note
        if capped:
            run.notes.append(capped_note(capped, run.durations, best))
        if len(run.scores) == len(TIERS):
            speed = sum(TIER_WEIGHTS[t] * run.scores[t] for t in TIERS)
            run.final = round(speed * (1.0 if run.c is None else run.c), 4)
    return best


COLUMNS = ("run", "ori", "margin", "ci95", "accuracy", "C", "S1", "S8", "Smax", "final", "gate")


def _cells(run: Run) -> List[str]:
    def num(value: Optional[float], fmt: str = ".2f") -> str:
        return "-" if value is None else format(value, fmt)

    accuracy = num(run.accuracy) + ("" if run.eval_complete in (None, True) else " (incomplete)")
    gate = "-" if run.c is None else ("below" if run.below_gate else "at risk" if run.at_risk else "pass")
    final = num(run.final) + (" (C=1 assumed)" if run.final is not None and run.c is None else "")
    g = run.gate
    ori, margin = (num(g.ori), format(g.margin, "+.2f")) if g is not None else ("-", "-")
    ci = f"{g.low:.2f}-{g.high:.2f}" if g is not None else "-"
    return [run.name, ori, margin, ci, accuracy, num(run.c, "g"), *[num(run.scores.get(t)) for t in TIERS], final, gate]


def render(runs: List[Run], fmt: str, best: Dict[str, float]) -> str:
    """The comparison as `table` (aligned text), `md`, `csv` or `json`. A run's notes follow the table (table,
    md), fill a last `notes` column (csv) or a `notes` list (json)."""
    if fmt == "json":
        return json.dumps({"best_s": best, "runs": [{**asdict(r), "gate": r.gate.to_dict() if r.gate else None,
                                                      "below_gate": r.below_gate, "at_risk": r.at_risk} for r in runs]},
                          indent=2)
    rows = [list(COLUMNS)] + [_cells(r) for r in runs]
    if fmt == "csv":
        noted = any(r.notes for r in runs)
        if noted:
            rows = [rows[0] + ["notes"]] + [row + ["; ".join(r.notes)] for row, r in zip(rows[1:], runs)]
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(rows)
        return out.getvalue().rstrip("\n")
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    risks = [f"{r.name}: {line}" for r in runs for line in r.risks]
    notes = [f"note: {n}" for r in runs for n in r.notes]
    if fmt == "md":
        lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in rows]
        lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n".join(lines + ([""] + [f"- {line}" for line in risks] if risks else []) + ([""] + notes if notes else []))
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
             for row in rows]
    return "\n".join(lines + risks + notes)
