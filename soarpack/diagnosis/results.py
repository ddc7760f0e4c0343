"""soarpack's eval and bench results read for what went wrong, per task (eval) or per tier (bench).

An eval result (soarpack/measure/evaluate.py) holds one record per row: task, prediction, output_tokens, error. Three
things are flagged: rows that ran to max_tokens and end in a repeated tail (repetition collapse), rows answered
with an empty prediction (as the platform scores it: the text after the last </think>), and rows whose request
failed (HTTP errors, timeouts, malformed replies). A bench result's tiers are flagged for failed requests.
A result whose shape is not what soarpack writes (rows that are not a list of records, a field of the wrong type,
no rows at all) is flagged as malformed rather than read as healthy.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Tuple

from soarpack.measure.scoring import final_answer
from soarpack.diagnosis.inputs import Input
from soarpack.diagnosis.scan import Finding

TAIL_CHARS = 4000  # how much of an answer's end is searched for a loop
MAX_PERIOD = 600  # the longest repeated unit looked for, in characters
MIN_REPEATS = 3
MIN_LOOP_CHARS = 200  # a loop must cover at least this much of the tail


def repeated_tail(text: str) -> Optional[Tuple[int, str]]:
    """(period, unit) when the text ends in at least MIN_REPEATS copies of one unit covering >= MIN_LOOP_CHARS;
    the shortest such unit. None otherwise."""
    tail = text[-TAIL_CHARS:]
    for period in range(1, MAX_PERIOD + 1):
        span = max(MIN_REPEATS * period, MIN_LOOP_CHARS)
        if span > len(tail):
            break
        window = tail[-span:]
        if window[period:] == window[:-period]:
            return period, tail[-period:]
    return None


def _per_task(records: List[dict]) -> Dict[str, int]:
    return dict(sorted(Counter(str(r.get("task")) for r in records).items()))


def _error_class(error: str) -> str:
    if error.startswith("HTTP "):
        return error.split(":", 1)[0]
    for prefix in ("timeout", "stalled", "malformed"):
        if error.startswith(prefix):
            return prefix
    return error.split(":", 1)[0][:60]


def _rows_where(records: List[dict], total: int) -> str:
    return f"{len(records)} of {total} rows ({', '.join(f'{k} {v}' for k, v in _per_task(records).items())})"


MALFORMED = "result-malformed"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def eval_problem(data) -> Optional[str]:
    """Why an eval result is not one soarpack wrote (its rows as soarpack/measure/evaluate.py records them), or None."""
    if not isinstance(data, dict):
        return "is not a JSON object"
    rows = data.get("rows")
    if not isinstance(rows, list):
        return f"has rows {type(rows).__name__ if rows is not None else 'missing'}, not a list"
    if not rows:
        return "holds no rows: the eval answered nothing"
    max_tokens = data.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        return f"has max_tokens {max_tokens!r}, not a positive integer"
    for position, row in enumerate(rows):
        where = f"row {position}"
        if not isinstance(row, dict):
            return f"{where} is a {type(row).__name__}, not a record"
        if not _is_int(row.get("index")):
            return f"{where} has index {row.get('index')!r}, not an integer"
        if not isinstance(row.get("task"), str):
            return f"{where} has task {row.get('task')!r}, not a string"
        error = row.get("error")
        if error is not None and not isinstance(error, str):
            return f"{where} has error {error!r}, not a string or null"
        if error is None and not isinstance(row.get("prediction"), str):
            return f"{where} has prediction {row.get('prediction')!r}, not a string"
        tokens = row.get("output_tokens")
        if tokens is not None and (not _is_int(tokens) or tokens < 0):
            return f"{where} has output_tokens {tokens!r}, not a count"
    return None


def bench_problem(data) -> Optional[str]:
    """Why a bench result is not one soarpack wrote (soarpack/measure/speed.py), or None."""
    tiers = data.get("tiers") if isinstance(data, dict) else None
    if not isinstance(tiers, dict) or not tiers:
        return "has no tiers" if not tiers else f"has tiers {type(tiers).__name__}, not an object"
    for name, tier in tiers.items():
        if not isinstance(tier, dict):
            return f"tier {name} is a {type(tier).__name__}, not a record"
        for key in ("failed", "num_requests"):
            if not _is_int(tier.get(key)) or tier[key] < 0:
                return f"tier {name} has {key} {tier.get(key)!r}, not a count"
        if not isinstance(tier.get("errors", []), list):
            return f"tier {name} has errors {tier.get('errors')!r}, not a list"
    return None


def _malformed(inp: Input, problem: str) -> List[Finding]:
    return [Finding(MALFORMED, str(inp.path), inp.kind, "the file", f"this {inp.kind} result {problem}", 1,
                    {"problem": problem})]


def eval_findings(inp: Input) -> List[Finding]:
    problem = eval_problem(inp.data)
    if problem:
        return _malformed(inp, problem)
    data = inp.data or {}
    rows = [r for r in data.get("rows") or [] if isinstance(r, dict)]
    max_tokens = data.get("max_tokens")
    total = len(rows)
    path = str(inp.path)
    findings = []

    errored = [r for r in rows if r.get("error")]
    if errored:
        classes = Counter(_error_class(str(r["error"])) for r in errored)
        first = errored[0]
        findings.append(Finding("eval-request-error", path, "eval", _rows_where(errored, total),
                                f"row {first.get('index')} ({first.get('task')}): {str(first['error'])[:200]}",
                                len(errored), {"per_task": _per_task(errored), "errors": dict(classes.most_common()),
                                               "rows": [r.get("index") for r in errored]}))

    answered = [r for r in rows if not r.get("error")]
    looping: List[Tuple[dict, Tuple[int, str]]] = []
    at_limit_no_loop = 0
    for record in answered:
        prediction = record.get("prediction") if isinstance(record.get("prediction"), str) else ""
        tokens = record.get("output_tokens")
        at_limit = isinstance(tokens, int) and isinstance(max_tokens, int) and tokens >= max_tokens
        if tokens is not None and not at_limit:
            continue
        loop = repeated_tail(prediction)
        if loop is not None:
            looping.append((record, loop))
        elif at_limit:
            at_limit_no_loop += 1
    if looping:
        record, (period, unit) = looping[0]
        findings.append(Finding(
            "eval-repetition-collapse", path, "eval", _rows_where([r for r, _ in looping], total),
            f"row {record.get('index')} ({record.get('task')}): {record.get('output_tokens')} of {max_tokens} tokens, "
            f"ends in {len(record['prediction'][-TAIL_CHARS:]) // period}+ copies of {unit[:80]!r}",
            len(looping), {"per_task": _per_task([r for r, _ in looping]), "rows": [r.get("index") for r, _ in looping],
                           "max_tokens": max_tokens, "at_max_tokens_without_a_loop": at_limit_no_loop}))

    empty = [r for r in answered if not final_answer(r.get("prediction") or "").strip()]
    if empty:
        first = empty[0]
        raw = (first.get("prediction") or "")
        findings.append(Finding("eval-empty-answer", path, "eval", _rows_where(empty, total),
                                f"row {first.get('index')} ({first.get('task')}): {len(raw)} characters, "
                                f"{first.get('output_tokens')} tokens, nothing after the last </think>",
                                len(empty), {"per_task": _per_task(empty), "rows": [r.get("index") for r in empty]}))
    return findings


def bench_findings(inp: Input) -> List[Finding]:
    problem = bench_problem(inp.data)
    if problem:
        return _malformed(inp, problem)
    tiers = (inp.data or {}).get("tiers") or {}
    failed = {name: t for name, t in tiers.items() if isinstance(t, dict) and t.get("failed")}
    if not failed:
        return []
    name, tier = next(iter(failed.items()))
    errors = tier.get("errors") or []
    count = sum(int(t["failed"]) for t in failed.values())
    return [Finding("eval-request-error", str(inp.path), "bench",
                    ", ".join(f"{n} {t['failed']} of {t.get('num_requests')} requests" for n, t in failed.items()),
                    f"{name}: {errors[0] if errors else 'failed requests'}"[:300], count,
                    {"per_tier": {n: t["failed"] for n, t in failed.items()}})]


def result_findings(inp: Input) -> List[Finding]:
    return eval_findings(inp) if inp.kind == "eval" else bench_findings(inp) if inp.kind == "bench" else []


__all__ = ["repeated_tail", "eval_findings", "bench_findings", "result_findings", "eval_problem", "bench_problem"]
