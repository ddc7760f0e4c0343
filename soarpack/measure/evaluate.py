"""`soarpack eval`: the platform's correctness run against any server, resumable, with per-row results.

The output JSON is rewritten atomically as rows finish (at most every `save_every_s`), so an interrupted run
loses at most those seconds; run it again with the same output and only rows not yet scored are sent. Rows that
errored are sent again on resume (an error is the server's or the network's, not an answer). Rows already in the
output stay in it, also those beyond `--num-samples`: a results file is merged, never truncated.

An existing output is resumed only when it was measured against the same server (api base) and model and made
from the same data; otherwise the run is refused before any request, unless `resume` (keep its rows anyway, e.g.
the same checkpoint served on another port; the file then lists every server; rows asked of another model id
are asked again, see below) or `force` (start over; the old
file is kept beside as NAME.old-N.json). Other data is always refused: its rows cannot be merged.

Resume trusts only what the server said: each stored prediction is scored again against today's gold (a score
in the file is never read back), and a row is kept only while its request key (question, max_tokens, stop
strings, served model, chat template) is this run's; a row asked differently is sent again and the run says so.

A run in which any request failed is incomplete, as a failed row scores 0 on the platform (eval_model.py does not
retry). `retries` re-sends a failed request; the report then gives the accuracy with and without those retries.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from soarpack.asyncrun import run_to_end
from soarpack.measure import client as http
from soarpack.measure.jsonl import read_jsonl_numbered
from soarpack.measure.provenance import measured, tool_versions
from soarpack.measure.scoring import c_factor, ori_accuracy, overall_accuracy, score_prediction
from soarpack.measure.tokenizer import chat_template_digest
from soarpack.deprecation import deprecated_field
from soarpack.errors import ConfigError, InputDataError, OutputExistsError
from soarpack.facts import limits
from soarpack.placement.checks import ensure_writable_output
from soarpack.placement.write import atomic_write_json
from soarpack.steps import Event, EventCallback, lines_to, no_events
from soarpack.inputs import MAX_RESULT_BYTES, read_bytes_capped

EVAL_KIND = "soarpack.eval"
PLATFORM_MAX_TOKENS = limits.EVAL_MAX_TOKENS
PLATFORM_TIMEOUT_S = limits.EVAL_TIMEOUT_S
# Once a reply has started, its body comes at once (eval requests are not streamed): a minute of silence is a fault.
DEFAULT_STALL_S = 60.0


@dataclass
class EvalConfig:
    api_base: str
    data: Path
    output: Optional[Path] = None
    model_dir: Optional[Path] = None
    trust_remote_code: bool = False  # run model_dir's tokenizer code for the stop strings (the user's trust-remote-code flag)
    concurrency: int = 32
    rows: Optional[int] = None  # only the first N rows (--rows; eval_model.py's --num_samples)
    timeout_s: float = PLATFORM_TIMEOUT_S
    max_tokens: int = PLATFORM_MAX_TOKENS
    save_every_s: float = 2.0
    stall_s: float = DEFAULT_STALL_S
    deadline_s: Optional[float] = None  # the whole request at most (--deadline); off, as on the platform
    retries: int = 0
    resume: bool = False  # keep an existing output's rows although its server or model differ
    force: bool = False  # start over; the existing output is kept beside as NAME.old-N.json
    label: Optional[str] = None  # what is measured, in the user's words (recorded in the result)
    bundle: Optional[Dict[str, Any]] = None  # `soarpack inspect` of the bundle whose checkpoint the server runs
    num_samples: InitVar[Optional[int]] = None  # deprecated: `rows` (kept for one release)

    def __post_init__(self, num_samples: Optional[int]) -> None:
        if num_samples is not None:
            self.rows = deprecated_field("EvalConfig", "num_samples", "rows", num_samples, self.rows)


def check_eval_config(cfg: EvalConfig) -> None:
    """Refuse settings that would send nonsense, before anything is read or sent."""
    http.check_api_base(cfg.api_base)
    http.check_deadline(cfg.deadline_s)
    if cfg.resume and cfg.force:
        raise ConfigError("--resume and --force contradict each other", "--resume keeps the rows, --force starts over")
    for flag, value in (("--timeout", cfg.timeout_s), ("--stall-timeout", cfg.stall_s)):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} {value:g} must be a positive number of seconds", f"the platform waits {PLATFORM_TIMEOUT_S:g} s")
    for flag, value, least in (("--max-tokens", cfg.max_tokens, 1), ("--concurrency", cfg.concurrency, 1),
                               ("--retries", cfg.retries, 0),
                               ("--rows", 1 if cfg.rows is None else cfg.rows, 1)):
        if value < least:
            raise ConfigError(f"{flag} {value} must be at least {least}", f"the platform sends --max-tokens {PLATFORM_MAX_TOKENS}")


def question_digest(question: str) -> str:
    return hashlib.sha1(question.encode("utf-8")).hexdigest()[:16]


def load_eval_rows(path: Path, num_samples: Optional[int] = None) -> List[dict]:
    """Rows `{task, question, gold}`, the first `num_samples` when given (as eval_model.py --num_samples);
    `question` and `task` must be strings (non-string answers are the server's fault, not the data's)."""
    numbered = read_jsonl_numbered(path, required=("task", "question", "gold"))
    for lineno, row in numbered:
        if not isinstance(row["question"], str) or not isinstance(row["task"], str):
            raise InputDataError(f"{path}:{lineno}: `task` and `question` must be strings", "fix the data file")
        if not row["question"].strip():
            raise InputDataError(f"{path}:{lineno}: `question` is empty or only whitespace: no answer can score",
                                 "fix or delete that line; nothing was sent")
    rows = [row for _, row in numbered]
    return rows[:num_samples] if num_samples else rows


def _read_previous(output: Path) -> dict:
    try:
        previous = json.loads(read_bytes_capped(output, "eval output", MAX_RESULT_BYTES).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):  # RecursionError: nested too deep to read
        raise InputDataError(f"{output} exists but is not JSON", "delete it or choose another -o") from None
    except OSError as exc:
        raise InputDataError(f"{output} cannot be read ({exc.strerror or exc})", "choose another -o") from None
    if not isinstance(previous, dict) or previous.get("kind") != EVAL_KIND or not isinstance(previous.get("rows", []), list):
        raise InputDataError(f"{output} exists and is not a soarpack eval result", "choose another -o")
    problem = _header_problem(previous)
    if problem:
        raise InputDataError(f"{output}: {problem}", "restore the file, or pass --force to start over (it is kept beside)")
    return previous


def _header_problem(previous: dict) -> Optional[str]:
    """Why the header of an earlier result cannot be compared with this run (a hand edit), or None."""
    for field in ("api_base", "model"):
        if previous.get(field) is not None and not isinstance(previous[field], str):
            return f"`{field}` is {previous[field]!r}, not a string"
    stop = previous.get("stop")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(word, str) for word in stop)):
        return f"`stop` is {stop!r}, not a list of strings"
    servers = previous.get("servers")
    if servers is not None and not (isinstance(servers, list) and all(
            isinstance(s, dict) and all(isinstance(s.get(k), (str, type(None))) for k in ("api_base", "model"))
            for s in servers)):
        return "`servers` is not a list of {api_base, model}"
    return None


def request_key(max_tokens: int, stop: List[str], model: Optional[str], chat_template: Optional[str]) -> dict:
    """What decides a row's prediction besides its question: a stored row is reused only under the same key."""
    return {"max_tokens": max_tokens, "stop": sorted(stop), "model": model, "chat_template_sha1": chat_template}


def _legacy_key(previous: dict) -> dict:
    """The key of a row written before rows carried one (version 2): the file's header; the template of its model
    directory was not recorded, so a row asked with one is asked again."""
    stop = previous.get("stop")
    template = "unknown (not recorded)" if previous.get("model_dir") else None
    return {"max_tokens": previous.get("max_tokens"), "stop": sorted(stop) if isinstance(stop, list) else stop,
            "model": previous.get("model"), "chat_template_sha1": template}


_OPTIONAL_TYPES = {"error": str, "first_error": str, "prompt_tokens": int, "output_tokens": int}


def _stored_row_problem(record: Any) -> Optional[str]:
    """Why a stored row cannot be reused (the fields resume reads back), or None."""
    if not isinstance(record, dict):
        return f"is a {type(record).__name__}, not an object"
    index = record.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        return f"has index {index!r}, not an integer"
    if not isinstance(record.get("question_sha1"), str):
        return "has no question_sha1 string"
    for field, kind in _OPTIONAL_TYPES.items():
        value = record.get(field)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"has {field} {value!r}, not a {kind.__name__} or null"
    if record.get("error") is None and not isinstance(record.get("prediction"), str):
        return f"has prediction {record.get('prediction')!r}, not a string"
    attempts = record.get("attempts", 1)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        return f"has attempts {attempts!r}, not a positive integer"
    latency = record.get("latency_s", 0.0)
    if not isinstance(latency, (int, float)) or isinstance(latency, bool) or not math.isfinite(latency) or latency < 0:
        return f"has latency_s {latency!r}, not a non-negative number"
    if "key" in record and not isinstance(record["key"], dict):
        return f"has key {record['key']!r}, not an object"
    return None


def previous_rows(previous: Optional[dict], rows: List[dict], output: Path) -> Dict[int, dict]:
    """The stored rows of an earlier run into the same output that hold an answer, each scored again against
    today's data (the stored score is never used); refuse a file made from other data, or one whose rows were
    edited into something resume cannot read (one line naming the row, not a traceback)."""
    kept: Dict[int, dict] = {}
    if previous is None:
        return kept
    legacy = _legacy_key(previous)
    for position, record in enumerate(previous.get("rows", [])):
        problem = _stored_row_problem(record)
        if problem:
            raise InputDataError(f"{output}: stored row {position + 1} {problem}",
                                 "restore the file, delete that row, or pass --force to start over")
        index = record["index"]
        if not 0 <= index < len(rows):
            continue
        if record["question_sha1"] != question_digest(rows[index]["question"]):
            raise InputDataError(f"{output} was made from a different data file (row {index} differs)",
                                 "use a new -o for this data, or the data it was made from")
        if record.get("error") is None:
            result = http.ChatResult(record["prediction"], record.get("prompt_tokens"), record.get("output_tokens"),
                                     float(record.get("latency_s", 0.0)), None)
            fresh = score_record(index, rows[index], result, record.get("first_error"), record.get("attempts", 1),
                                 key=record.get("key", legacy))
            fresh["stored_score"] = record.get("score")
            kept[index] = fresh
    return kept


def drop_changed_rows(done: Dict[int, dict], key: dict, note: Callable[[str], None],
                      selected: Optional[range] = None) -> None:
    """Remove the selected stored rows whose request key is not this run's (they are sent again) and say what
    changed; rows outside the selection stay as they are, with their own key (a result is never truncated). Say
    also when stored scores differ from today's scoring (the gold changed, or the file was edited)."""
    changed: Dict[str, set] = {}
    dropped = 0
    for index in sorted(i for i in done if selected is None or i in selected):
        theirs = done[index]["key"]
        diff = [field for field in key if theirs.get(field) != key[field]]
        if diff:
            for field in diff:
                changed.setdefault(field, set()).add(json.dumps(theirs.get(field)))
            del done[index]
            dropped += 1
    rescored = 0
    for record in done.values():
        if record.pop("stored_score", None) != record["score"]:
            rescored += 1
    if changed:
        what = "; ".join(f"{field} was {' or '.join(sorted(values))}, now {json.dumps(key[field])}"
                         for field, values in changed.items())
        note(f"re-running {dropped} stored row(s) asked differently from this run ({what})")
    if rescored:
        note(f"{rescored} stored row(s) score differently against today's data (changed gold or an edited file): "
             "today's scores are used")


def server_mismatch(previous: dict, api_base: str, served: dict) -> Optional[str]:
    """How the server of an earlier run differs from this one's (None: the same api base and model)."""
    theirs = (previous.get("api_base") or "").rstrip("/"), previous.get("model")
    if theirs[0] != api_base.rstrip("/"):
        return f"it was measured against {theirs[0]} (model {theirs[1]}), this run is {api_base} (model {served['id']})"
    if theirs[1] is not None and theirs[1] != served["id"]:
        return f"it was measured on model {theirs[1]}, the server at {api_base} now serves {served['id']}"
    return None


def eval_inputs(cfg: EvalConfig) -> list:
    """What an eval reads and its result must never replace: the data, the model dir, the bundle."""
    bundle = (cfg.bundle or {}).get("path")
    return [p for p in (cfg.data, cfg.model_dir, bundle) if p is not None]


def set_aside(path: Path) -> Path:
    """Rename a result file to the first free NAME.old-N.json beside it (a result is never deleted)."""
    n = 1
    while (aside := path.with_name(f"{path.stem}.old-{n}{path.suffix}")).exists():
        n += 1
    path.rename(aside)
    return aside


def _accuracies(scores: List[float]) -> dict:
    ori = ori_accuracy(scores)
    overall = overall_accuracy(ori)
    return {"ori_accuracy": ori, "overall_accuracy": overall, "c_factor": c_factor(overall)}


def summarize(records: List[dict], total: int) -> dict:
    """Per-task table, accuracies and C over the rows scored so far (errors count as 0)."""
    per_task: Dict[str, dict] = {}
    for record in records:
        bucket = per_task.setdefault(record["task"], {"count": 0, "score_sum": 0.0})
        bucket["count"] += 1
        bucket["score_sum"] += record["score"]
    for bucket in per_task.values():
        bucket["score_sum"] = round(bucket["score_sum"], 6)
        bucket["accuracy"] = round(100.0 * bucket["score_sum"] / bucket["count"], 2)
    errors = [{"index": r["index"], "task": r["task"], "error": r["error"]} for r in records if r["error"]]
    first_try = [0.0 if r.get("first_error") else r["score"] for r in records]
    return {
        "total": total,
        "scored": len(records),
        "failed": len(errors),
        # A failed request scores 0 on the platform too, but it is the server's or network's fault: not a result.
        "complete": len(records) == total and not errors,
        "per_task": dict(sorted(per_task.items())),
        **_accuracies([record["score"] for record in records]),
        "retried": sum(1 for r in records if r.get("first_error")),
        "without_retries": _accuracies(first_try),
        "errors": errors,
    }


def score_record(index: int, row: dict, result: http.ChatResult, first_error: Optional[str] = None,
                 attempts: int = 1, key: Optional[dict] = None) -> dict:
    prediction = result.content if result.content is not None else ""
    score, extracted = score_prediction(row["task"], prediction, row["gold"])
    return {
        "index": index,
        "task": row["task"],
        "question_sha1": question_digest(row["question"]),
        "gold": row["gold"],
        "prediction": prediction,
        "extracted": extracted,
        "score": score,
        "prompt_tokens": result.prompt_tokens,
        "output_tokens": result.completion_tokens,
        "latency_s": round(result.latency_s, 4),
        "error": result.error,
        "attempts": attempts,
        "first_error": first_error,
        "key": key,
    }


async def _ask(client, model: str, question: str, cfg: EvalConfig, stop: List[str]) -> tuple:
    """(result, error of the first attempt, attempts): up to 1 + cfg.retries attempts while they fail."""
    first_error = None
    for attempt in range(1, cfg.retries + 2):
        result = await http.chat_completion(client, model, question, cfg.max_tokens, stop, cfg.stall_s, cfg.deadline_s)
        if attempt == 1:
            first_error = result.error
        if result.error is None:
            break
    return result, first_error, attempt


async def run_eval_async(cfg: EvalConfig, on_event: EventCallback = no_events) -> dict:
    """Send every unscored row (at most `concurrency` in flight), score it, and return the report. Each scored row
    is a "progress" event whose data is the row's record; notes are "info" events."""
    note = lines_to(on_event, "eval")
    check_eval_config(cfg)
    api_base = http.check_api_base(cfg.api_base)
    if cfg.output is not None:
        ensure_writable_output(cfg.output, what="eval output", inputs=eval_inputs(cfg))
    rows = load_eval_rows(cfg.data)
    selected = range(min(cfg.rows or len(rows), len(rows)))
    previous = _read_previous(cfg.output) if cfg.output is not None and cfg.output.is_file() else None
    done = previous_rows(previous, rows, cfg.output) if not cfg.force else {}
    stop: List[str] = []
    if cfg.model_dir is not None:
        from soarpack.measure.tokenizer import stop_strings

        stop = stop_strings(cfg.model_dir, trust_remote_code=cfg.trust_remote_code)
    template = chat_template_digest(cfg.model_dir) if cfg.model_dir is not None else None
    header = {"kind": EVAL_KIND, "version": 3, "api_base": api_base, "data": str(cfg.data),
              "model_dir": str(cfg.model_dir) if cfg.model_dir else None, "stop": stop, "max_tokens": cfg.max_tokens,
              "num_samples": cfg.rows, "retries": cfg.retries}
    bundle_measured = measured(cfg.label, cfg.bundle, None)
    last_save = [0.0]

    def report() -> dict:
        # The summary covers the selected rows; every scored row stays in the file.
        records = [done[i] for i in selected if i in done]
        return {**header, **summarize(records, len(selected)), "rows": [done[i] for i in sorted(done)]}

    def save(force: bool = False) -> None:
        if cfg.output is not None and (force or time.monotonic() - last_save[0] >= cfg.save_every_s):
            atomic_write_json(cfg.output, report(), inputs=eval_inputs(cfg))
            last_save[0] = time.monotonic()

    async with http.make_client(api_base, cfg.concurrency, cfg.timeout_s) as client:
        served = await http.served_model(client)
        header["model"] = served["id"]
        header["measured"] = {**bundle_measured, "served_model": served}
        header["versions"] = tool_versions()
        key = request_key(cfg.max_tokens, stop, served["id"], template)
        header["chat_template_sha1"] = template
        if previous is not None:
            _merge_or_refuse(cfg, previous, api_base, served, header, done, len(selected), note, key)
        pending = [i for i in selected if i not in done]
        if not pending:
            save(force=True)
            return report()
        gate = asyncio.Semaphore(cfg.concurrency)

        async def one(index: int) -> None:
            async with gate:
                result, first_error, attempts = await _ask(client, header["model"], rows[index]["question"], cfg, stop)
            done[index] = score_record(index, rows[index], result, first_error, attempts, key)
            on_event(Event("progress", "eval", done=sum(1 for i in selected if i in done), total=len(selected),
                           data=done[index]))
            save()

        try:
            await asyncio.gather(*(one(i) for i in pending))
        finally:
            save(force=True)
    return report()


def _merge_or_refuse(cfg: EvalConfig, previous: dict, api_base: str, served: dict, header: dict, done: Dict[int, dict],
                     total: int, note: Callable[[str], None], key: dict) -> None:
    """Decide what an existing output becomes: resumed, resumed across servers (--resume), or set aside (--force)."""
    if cfg.force:
        note(f"--force: starting over; the earlier result was kept as {set_aside(cfg.output)}")
        return
    mismatch = server_mismatch(previous, api_base, served)
    if mismatch and not cfg.resume:
        raise OutputExistsError(f"{cfg.output} holds another server's result: {mismatch}",
                                "pass a new -o to keep both, --resume to add to its rows anyway, or --force to "
                                "start over (the old file is kept as NAME.old-N.json)")
    servers = list(previous.get("servers") or [{"api_base": previous.get("api_base"), "model": previous.get("model")}])
    if {"api_base": api_base, "model": served["id"]} not in servers:
        servers.append({"api_base": api_base, "model": served["id"]})
    if len(servers) > 1:
        header["servers"] = servers
    drop_changed_rows(done, key, note, range(total))
    scored = sum(1 for i in range(total) if i in done)
    note(f"resuming {scored}/{total} rows from {cfg.output}" + (f" ({mismatch}; --resume)" if mismatch else ""))


def run_eval(cfg: EvalConfig, on_event: EventCallback = no_events) -> dict:
    return run_to_end(lambda: run_eval_async(cfg, on_event))  # also inside a running loop (a notebook)
