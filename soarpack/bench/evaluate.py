"""`soarpack eval`: the platform's correctness run against any server, resumable, with per-row results.

The output JSON is rewritten atomically as rows finish (at most every `save_every_s`), so an interrupted run
loses at most those seconds; run it again with the same output and only rows not yet scored are sent. Rows that
errored are sent again on resume (an error is the server's or the network's, not an answer).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from soarpack.bench import client as http
from soarpack.bench.jsonl import read_jsonl_numbered
from soarpack.bench.scoring import c_factor, ori_accuracy, overall_accuracy, score_prediction
from soarpack.errors import InputDataError
from soarpack.fsutil import atomic_write_json

EVAL_KIND = "soarpack.eval"
PLATFORM_MAX_TOKENS = 65536


@dataclass
class EvalConfig:
    api_base: str
    data: Path
    output: Optional[Path] = None
    model_dir: Optional[Path] = None
    concurrency: int = 32
    num_samples: Optional[int] = None
    timeout_s: float = 3000.0
    max_tokens: int = PLATFORM_MAX_TOKENS
    save_every_s: float = 2.0


def question_digest(question: str) -> str:
    return hashlib.sha1(question.encode("utf-8")).hexdigest()[:16]


def load_eval_rows(path: Path, num_samples: Optional[int] = None) -> List[dict]:
    """Rows `{task, question, gold}`, the first `num_samples` when given (as eval_model.py --num_samples)."""
    numbered = read_jsonl_numbered(path, required=("task", "question", "gold"))
    for lineno, row in numbered:
        if not isinstance(row["question"], str) or not isinstance(row["task"], str):
            raise InputDataError(f"{path}:{lineno}: `task` and `question` must be strings", "fix the data file")
    rows = [row for _, row in numbered]
    return rows[:num_samples] if num_samples else rows


def load_previous(output: Optional[Path], rows: List[dict]) -> Dict[int, dict]:
    """Scored records from an earlier run into the same output; refuse one made from other data."""
    if output is None or not output.is_file():
        return {}
    try:
        previous = json.loads(output.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise InputDataError(f"{output} exists but is not JSON", "delete it or choose another -o") from None
    if previous.get("kind") != EVAL_KIND:
        raise InputDataError(f"{output} exists and is not a soarpack eval result", "choose another -o")
    kept = {}
    for record in previous.get("rows", []):
        index = record.get("index")
        if not isinstance(index, int) or index >= len(rows):
            continue
        if record.get("question_sha1") != question_digest(rows[index]["question"]):
            raise InputDataError(f"{output} was made from a different data file (row {index} differs)",
                                 "use a new -o for this data, or the data it was made from")
        if record.get("error") is None:
            kept[index] = record
    return kept


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
    ori = ori_accuracy([record["score"] for record in records])
    overall = overall_accuracy(ori)
    return {
        "total": total,
        "scored": len(records),
        "complete": len(records) == total,
        "per_task": dict(sorted(per_task.items())),
        "ori_accuracy": ori,
        "overall_accuracy": overall,
        "c_factor": c_factor(overall),
        "errors": [{"index": r["index"], "task": r["task"], "error": r["error"]} for r in records if r["error"]],
    }


def score_record(index: int, row: dict, result: http.ChatResult) -> dict:
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
    }


async def run_eval_async(cfg: EvalConfig, on_result: Optional[Callable[[dict, int, int], None]] = None) -> dict:
    """Send every unscored row (at most `concurrency` in flight), score it, and return the report."""
    rows = load_eval_rows(cfg.data, cfg.num_samples)
    done = load_previous(cfg.output, rows)
    stop: List[str] = []
    if cfg.model_dir is not None:
        from soarpack.bench.tokenizer import stop_strings

        stop = stop_strings(cfg.model_dir)
    pending = [i for i in range(len(rows)) if i not in done]
    header = {"kind": EVAL_KIND, "version": 1, "api_base": cfg.api_base, "data": str(cfg.data),
              "model_dir": str(cfg.model_dir) if cfg.model_dir else None, "stop": stop, "max_tokens": cfg.max_tokens}
    last_save = [0.0]

    def report() -> dict:
        records = [done[i] for i in sorted(done)]
        return {**header, **summarize(records, len(rows)), "rows": records}

    def save(force: bool = False) -> None:
        if cfg.output is not None and (force or time.monotonic() - last_save[0] >= cfg.save_every_s):
            atomic_write_json(cfg.output, report())
            last_save[0] = time.monotonic()

    if not pending:
        save(force=True)
        return report()

    async with http.make_client(cfg.api_base, cfg.concurrency, cfg.timeout_s) as client:
        header["model"] = await http.model_id(client)
        gate = asyncio.Semaphore(cfg.concurrency)

        async def one(index: int) -> None:
            async with gate:
                result = await http.chat_completion(client, header["model"], rows[index]["question"], cfg.max_tokens, stop)
            done[index] = score_record(index, rows[index], result)
            if on_result is not None:
                on_result(done[index], len(done), len(rows))
            save()

        try:
            await asyncio.gather(*(one(i) for i in pending))
        finally:
            save(force=True)
    return report()


def run_eval(cfg: EvalConfig, on_result: Optional[Callable[[dict, int, int], None]] = None) -> dict:
    return asyncio.run(run_eval_async(cfg, on_result))
