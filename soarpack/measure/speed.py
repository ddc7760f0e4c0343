"""`soarpack bench`: the platform's speed run (bench_serving.sh → `sglang.bench_serving --backend sglang
--dataset-name custom --flush-cache`), one tier after another on one server.

Per tier, as one bench_serving invocation does (read from the fork's `sglang/bench_serving.py`, `benchmark()` and
`sample_custom_requests()`, and the organisers' `bench_serving.sh`; `tests/test_bench_conformance.py` runs both
against one stand-in server and holds this module to them): rows read as the script converts them (the prompt is
`question`, else `input`, else `prompt`; `model_response` defaults to "placeholder"), shuffled with
`random.seed(1)`, lengths counted with the served model's tokenizer (default special tokens; rows with fewer than
2 prompt or output tokens dropped), one warm-up request (the first row after the shuffle, at most 32 new tokens),
`/flush_cache`, a 1 s pause, then the timed run: every row dispatched at once, in order, behind a semaphore of the
tier's concurrency (none for Smax), each on a connection of its own. Duration runs from the first dispatch to the
last completion **and the `/get_server_info` answer after it**, which bench_serving asks inside its timed window;
what that answer says (model path, quantization, server args) is recorded beside the tier, with the speed set's
sha256, so a result can be traced to the server and the data that produced it.

Requests carry ignore_eos and ask exact lengths, so a request that streams fewer tokens than asked is counted as
short, and one whose server claims more than asked as long: either way the tier did other work than the
platform's and `soarpack score` refuses its duration. While the run is in
progress the report goes to `<output>.partial.json`; the output itself is replaced only by a complete report, so an
interrupted bench never overwrites an earlier complete one.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from soarpack.asyncrun import run_to_end
from soarpack.measure import client as http
from soarpack.measure.jsonl import read_jsonl_numbered
from soarpack.measure.provenance import measured, tool_versions
from soarpack.measure.stats import summary_ms
from soarpack.deprecation import deprecated_field
from soarpack.errors import ConfigError, InputDataError, SoarpackError
from soarpack.placement.checks import ensure_writable_output
from soarpack.placement.write import atomic_write_json
from soarpack.steps import Event, EventCallback, no_events

BENCH_KIND = "soarpack.bench"
TIER_CONCURRENCY: Dict[str, Optional[int]] = {"s1": 1, "s8": 8, "smax": None}
WARMUP_MAX_NEW_TOKENS = 32
BENCH_SERVING_TIMEOUT_S = 6 * 60 * 60  # bench_serving's aiohttp total timeout
# A stream silent this long after its first token is dead (before it, a request may wait behind others' prefills:
# no stall limit applies there, only the deadline, as in bench_serving).
DEFAULT_STALL_S = 600.0
PLACEHOLDER_RESPONSE = "placeholder"  # bench_serving.sh's default model_response
# The server args recorded from /get_server_info: its scalar entries, each string cut to this many characters.
SERVER_ARG_MAX_CHARS = 512
SERVER_ARGS_MAX = 512
SERVER_HEADLINE = ("model_path", "served_model_name", "quantization", "dtype", "kv_cache_dtype", "attention_backend",
                   "chunked_prefill_size", "cuda_graph_max_bs", "max_running_requests", "version")


@dataclass(frozen=True)
class SpeedRequest:
    prompt: str
    prompt_len: int
    output_len: int


def load_speed_pairs(path: Path) -> List[Tuple[str, str]]:
    """(prompt, model_response) pairs, read as the platform reads them: bench_serving.sh converts each row with
    `question or input or prompt` and `model_response` (default "placeholder") into `conversations`, which
    bench_serving's custom loader reads; rows already in that `conversations` form are read as the loader does."""
    pairs = []
    for lineno, row in read_jsonl_numbered(path):
        turns = row.get("conversations", row.get("conversation"))
        prompt = row.get("question") or row.get("input") or row.get("prompt")
        if prompt is not None:
            pair = (prompt, row.get("model_response", PLACEHOLDER_RESPONSE))
        elif isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) for t in turns[:2]):
            pair = tuple(t.get("content", t.get("value", "")) for t in turns[:2])
        else:
            raise InputDataError(f"{path}:{lineno}: no question (or input, prompt) and no conversations",
                                 'each line must be {"question": ..., "model_response": ...}')
        if not all(isinstance(text, str) for text in pair):
            raise InputDataError(f"{path}:{lineno}: question and model_response must be strings", "fix the data file")
        pairs.append(pair)
    return pairs


def prepare_requests(pairs: Sequence[Tuple[str, str]], count: Callable[[str], int], seed: int = 1,
                     num_prompts: Optional[int] = None) -> List[SpeedRequest]:
    """bench_serving's custom dataset: shuffle with `random.seed(seed)`, then count and prune in that order."""
    shuffled = list(pairs)
    random.Random(seed).shuffle(shuffled)
    requests = []
    for question, response in shuffled:
        if num_prompts is not None and len(requests) == num_prompts:
            break
        prompt_len, output_len = count(question), count(response)
        if prompt_len < 2 or output_len < 2:
            continue
        requests.append(SpeedRequest(question, prompt_len, output_len))
    return requests


@dataclass
class BenchConfig:
    api_base: str
    tiers: Dict[str, Path]  # tier name (s1, s8, smax) → JSONL; absent tiers are skipped as on the platform
    model_dir: Optional[Path] = None  # required: the served model's folder, whose tokenizer counts the lengths (a
    # server's model id is never opened)
    trust_remote_code: bool = False  # run the tokenizer folder's own code (the user's trust-remote-code flag)
    output: Optional[Path] = None
    seed: int = 1
    rows: Optional[int] = None  # only the first N rows after shuffling (bench_serving's --num-prompts)
    warmup: bool = True
    flush_cache: bool = True
    settle_s: float = 1.0
    timeout_s: float = BENCH_SERVING_TIMEOUT_S
    stall_s: float = DEFAULT_STALL_S
    # bench_serving's aiohttp session has a total timeout per request: the default deadline is the same 6 h.
    deadline_s: Optional[float] = BENCH_SERVING_TIMEOUT_S
    concurrency_override: Dict[str, Optional[int]] = field(default_factory=dict)
    label: Optional[str] = None  # what is measured, in the user's words (recorded in the result)
    bundle: Optional[Dict[str, Any]] = None  # `soarpack inspect` of the bundle whose checkpoint the server runs
    tokenizer_dir: InitVar[Optional[Path]] = None  # deprecated: `model_dir` (kept for one release)
    num_prompts: InitVar[Optional[int]] = None  # deprecated: `rows`

    def __post_init__(self, tokenizer_dir: Optional[Path], num_prompts: Optional[int]) -> None:
        if tokenizer_dir is not None:
            self.model_dir = deprecated_field("BenchConfig", "tokenizer_dir", "model_dir", tokenizer_dir, self.model_dir)
        if num_prompts is not None:
            self.rows = deprecated_field("BenchConfig", "num_prompts", "rows", num_prompts, self.rows)


def tier_metrics(results: List[http.StreamResult], requests: List[SpeedRequest], duration_s: float) -> dict:
    ok = [(res, req) for res, req in zip(results, requests) if res.success]
    output_tokens = sum(res.output_tokens for res, _ in ok)
    input_tokens = sum(req.prompt_len for _, req in ok)
    errors = [res.error for res in results if not res.success]
    short = [(res.output_tokens, req.output_len) for res, req in ok if res.output_tokens < req.output_len]
    long = [(res.claimed_tokens, req.output_len) for res, req in ok if res.claimed_tokens > req.output_len]
    return {
        "num_requests": len(requests),
        "completed": len(ok),
        "failed": len(errors),
        "errors": errors[:10],
        "short_outputs": len(short),
        "short_examples": [f"{got} of {asked} tokens" for got, asked in short[:10]],
        "long_outputs": len(long),
        "long_examples": [f"{got} of {asked} tokens" for got, asked in long[:10]],
        "duration_s": round(duration_s, 6),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "requested_output_tokens": sum(req.output_len for req in requests),
        "request_throughput": round(len(ok) / duration_s, 4) if duration_s else 0.0,
        "input_throughput": round(input_tokens / duration_s, 2) if duration_s else 0.0,
        "output_throughput": round(output_tokens / duration_s, 2) if duration_s else 0.0,
        "ttft_ms": summary_ms([res.ttft_s for res, _ in ok]),
        "itl_ms": summary_ms([itl for res, _ in ok for itl in res.itl_s]),
        "tpot_ms": summary_ms([tpot_s(res) for res, _ in ok if res.output_tokens > 1]),
        "e2e_ms": summary_ms([res.latency_s for res, _ in ok]),
        # In dispatch order: what each request asked and got, to hold the run to another client's, and its times, to
        # tell which requests moved a mean (benchmarks/RESULTS.md §16: one server, S8 mean TPOT 41 % above the other
        # client's).
        "requests": [request_row(res, req) for res, req in zip(results, requests)],
    }


def tpot_s(res: http.StreamResult) -> float:
    """bench_serving's TPOT of a request with more than one token: (e2e - TTFT) / (output tokens - 1)."""
    return (res.latency_s - res.ttft_s) / (res.output_tokens - 1)


def request_row(res: http.StreamResult, req: SpeedRequest) -> dict:
    row = {"prompt_sha256": hashlib.sha256(req.prompt.encode("utf-8", "surrogatepass")).hexdigest()[:16],
           "prompt_len": req.prompt_len, "output_len": req.output_len,
           "output_tokens": res.output_tokens if res.success else None}
    if res.success:
        row.update(ttft_ms=round(res.ttft_s * 1000, 3), e2e_ms=round(res.latency_s * 1000, 3),
                   tpot_ms=round(tpot_s(res) * 1000, 3) if res.output_tokens > 1 else None,
                   itl_max_ms=round(max(res.itl_s) * 1000, 3) if res.itl_s else None)
    return row


async def run_tier(client, requests: List[SpeedRequest], concurrency: Optional[int], *, warmup: bool = True,
                   flush_cache: bool = True, settle_s: float = 1.0, stall_s: Optional[float] = None,
                   deadline_s: Optional[float] = None, on_done: Optional[Callable[[int, int], None]] = None) -> dict:
    """Warm up, flush, then the timed run; returns the tier's metrics."""
    if not requests:
        raise InputDataError("no request is left after dropping rows under 2 tokens", "check the speed data file")
    if warmup:
        first = requests[0]
        test = await http.stream_generate(client, first.prompt, min(first.output_len, WARMUP_MAX_NEW_TOKENS), stall_s,
                                         deadline_s)
        if not test.success:
            raise SoarpackError(f"the warm-up request failed ({test.error})", "check the server log and --api-base")
    if flush_cache:
        await http.flush_cache(client)
    if settle_s:
        await asyncio.sleep(settle_s)
    gate = asyncio.Semaphore(concurrency) if concurrency else None
    finished = [0]

    async def one(req: SpeedRequest) -> http.StreamResult:
        if gate is None:
            result = await http.stream_generate(client, req.prompt, req.output_len, stall_s, deadline_s)
        else:
            async with gate:
                result = await http.stream_generate(client, req.prompt, req.output_len, stall_s, deadline_s)
        finished[0] += 1
        if on_done is not None:
            on_done(finished[0], len(requests))
        return result

    start = time.perf_counter()
    results = await asyncio.gather(*(one(req) for req in requests))
    info = await http.server_info(client)  # inside the window, as bench_serving asks it before it stops the clock
    duration = time.perf_counter() - start
    return {"concurrency": concurrency, **tier_metrics(list(results), requests, duration),
            "server_info_error": info["error"], "_server_info": info["info"]}


def _token_counter(cfg: BenchConfig) -> Callable[[str], int]:
    from soarpack.measure.tokenizer import count_tokens, load_tokenizer

    tokenizer = load_tokenizer(cfg.model_dir, trust_remote_code=cfg.trust_remote_code)
    return lambda text: count_tokens(tokenizer, text)


def partial_path(output: Path) -> Path:
    """Where an unfinished bench keeps its tiers, beside the output it must not replace."""
    return output.with_name(f"{output.stem}.partial{output.suffix or '.json'}")


def check_bench_config(cfg: BenchConfig) -> None:
    http.check_api_base(cfg.api_base)
    http.check_deadline(cfg.deadline_s)
    if cfg.model_dir is None:
        # bench_serving falls back to the served model id; a server must not choose which folder's code runs here.
        raise ConfigError("bench needs --model-dir: the served model's folder, whose tokenizer counts the lengths",
                          "pass --model-dir with the checkpoint the server runs (the server's model id is never "
                          "opened as a folder)")
    for flag, value in (("--stall-timeout", cfg.stall_s), ("timeout", cfg.timeout_s)):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{flag} {value:g} must be a positive number of seconds", f"the default is {DEFAULT_STALL_S:g}")
    if not (math.isfinite(cfg.settle_s) and cfg.settle_s >= 0):
        raise ConfigError(f"--settle {cfg.settle_s:g} must be a number of seconds, 0 or more",
                          "bench_serving waits 1 s after the flush")
    if cfg.rows is not None and cfg.rows < 1:
        raise ConfigError(f"--rows {cfg.rows} must be at least 1", "leave --rows out to send every row")
    unknown = sorted(set(cfg.tiers) - set(TIER_CONCURRENCY))
    if unknown or not cfg.tiers:
        raise SoarpackError("no speed data for any tier" if not unknown else f"unknown tier(s) {unknown}",
                            "pass at least one of --s1, --s8, --smax with a JSONL file")
    if cfg.output is not None:
        ensure_writable_output(cfg.output, what="bench output", inputs=bench_inputs(cfg))


def bench_inputs(cfg: BenchConfig) -> list:
    """What a bench reads and its result must never replace: the speed files, the tokenizer, the bundle."""
    bundle = (cfg.bundle or {}).get("path")
    return [*cfg.tiers.values(), *(p for p in (cfg.model_dir, bundle) if p is not None)]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def server_record(info: Optional[dict]) -> Optional[dict]:
    """What a result keeps of `/get_server_info`: the headline fields, every scalar server arg (bounded), and the
    sha256 of the whole answer; None when the server gave none."""
    if info is None:
        return None
    import json

    def bounded(value):
        return value[:SERVER_ARG_MAX_CHARS] if isinstance(value, str) else value

    scalars = {k: bounded(v) for k, v in sorted(info.items())[:SERVER_ARGS_MAX]
               if isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool)))}
    raw = json.dumps(info, sort_keys=True, default=str).encode("utf-8", "replace")
    return {"headline": {k: scalars.get(k) for k in SERVER_HEADLINE}, "server_args": scalars,
            "sha256": hashlib.sha256(raw).hexdigest()}


async def run_bench_async(cfg: BenchConfig, on_event: EventCallback = no_events) -> dict:
    check_bench_config(cfg)
    pairs = {name: load_speed_pairs(path) for name, path in cfg.tiers.items()}  # every file checked before sending
    digests = {name: file_sha256(path) for name, path in cfg.tiers.items()}
    api_base = http.check_api_base(cfg.api_base)
    bundle_measured = measured(cfg.label, cfg.bundle, None)
    report = {"kind": BENCH_KIND, "version": 3, "api_base": api_base, "seed": cfg.seed, "tiers": {},
              "client": {"reproduces": "the organisers' bench_serving.sh: sglang.bench_serving --backend sglang "
                                       "--dataset-name custom --flush-cache, one tier per run",
                         "duration": "first dispatch to last completion, plus the /get_server_info answer"}}
    # No pool limit: only the tier's semaphore may hold requests back, as in bench_serving; no keep-alive: a
    # connection per request, as its aiohttp session per request.
    async with http.make_client(api_base, None, cfg.timeout_s, keep_alive=False) as client:
        served = await http.served_model(client)
        count = _token_counter(cfg)
        prepared = {name: prepare_requests(pairs[name], count, cfg.seed, cfg.rows) for name in pairs}
        report["model"] = served["id"]
        report["measured"] = {**bundle_measured, "served_model": served}
        report["versions"] = tool_versions()
        for name in TIER_CONCURRENCY:
            if name not in prepared:
                continue
            concurrency = cfg.concurrency_override.get(name, TIER_CONCURRENCY[name])
            progress = lambda done, total, _name=name: on_event(Event("progress", _name, done=done, total=total))  # noqa: E731
            tier = await run_tier(client, prepared[name], concurrency, warmup=cfg.warmup, flush_cache=cfg.flush_cache,
                                  settle_s=cfg.settle_s, stall_s=cfg.stall_s, deadline_s=cfg.deadline_s,
                                  on_done=progress)
            info = tier.pop("_server_info")
            report["tiers"][name] = {"data": str(cfg.tiers[name]), "data_sha256": digests[name], **tier}
            if info is not None:
                report["server"] = server_record(info)  # the last tier's answer: the server as it was at the end
            if cfg.output is not None:
                atomic_write_json(partial_path(cfg.output), report, inputs=bench_inputs(cfg))
    if cfg.output is not None:
        atomic_write_json(cfg.output, report, inputs=bench_inputs(cfg))
        partial_path(cfg.output).unlink(missing_ok=True)
    return report


def run_bench(cfg: BenchConfig, on_event: EventCallback = no_events) -> dict:
    return run_to_end(lambda: run_bench_async(cfg, on_event))  # also inside a running loop (a notebook)
