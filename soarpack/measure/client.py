"""The HTTP requests the platform sends to an SGLang server, as async httpx calls.

Request bodies copy `eval_model.py` (chat completions) and `sglang.bench_serving --backend sglang` (`/generate`),
so a server sees locally what it will see on the platform.

A reply is the peer's to choose, so every size in it is bounded here: a body, a stream line, an error text, a model
id, and every token count (at most what the request asked). Time is bounded three ways: the client's timeout per
read, `stall_s` of silence once a reply has started, and `deadline_s` for the whole request (None: none; a server
trickling a byte a second passes the first two).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, List, Optional, TypeVar

import anyio
import httpx

from soarpack.errors import ConfigError, SoarpackError


class ServerError(SoarpackError):
    """The server cannot be reached or does not answer like an SGLang server."""


class StallError(Exception):
    """A reply started but then sent no byte for `stall_s` seconds."""

    def __init__(self, stall_s: float):
        super().__init__(f"stalled: no byte for {stall_s:g} s")


T = TypeVar("T")

MAX_REPLY_BYTES = 64 << 20  # a chat completion of the eval's max_tokens, every character \u-escaped, is far less
MAX_LINE_BYTES = 16 << 20  # one streamed `data:` line (its text is cumulative)
MAX_ERROR_BYTES = 4096  # of a failed reply's body: 200 characters of it are shown
MAX_MODELS_BYTES = 1 << 20  # the /v1/models answer
MAX_MODEL_ID_CHARS = 4096
MAX_PROMPT_TOKENS = 1 << 24  # a claimed prompt length above any context window is not recorded as given


class ReplyTooLarge(Exception):
    """A reply, or one line of a stream, is larger than we accept from a peer."""

    def __init__(self, what: str, limit: int):
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 and not limit % (1 << 20) else f"{limit} bytes"
        super().__init__(f"{what} larger than {size}")


class DeadlineError(Exception):
    """The whole request took longer than `deadline_s`."""

    def __init__(self, deadline_s: float):
        super().__init__(f"deadline: no complete reply within {deadline_s:g} s")


def claimed_count(value, cap: int) -> Optional[int]:
    """A token count a peer claims, as a count in [0, cap]; None when it is no integer at all."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return min(max(value, 0), cap)


def _chunk_claim(value) -> int:
    """A stream chunk's `completion_tokens` (an int, or what int() reads), not below 0; at most 20 digits."""
    if isinstance(value, str) and len(value) > 20:  # int() of a huge digit string is slow on some Pythons
        raise ValueError("completion_tokens is not a count")
    return max(int(value), 0)


async def read_bounded(chunks: AsyncIterator[bytes], limit: int, what: str) -> bytes:
    """The concatenated chunks, refusing more than `limit` bytes."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise ReplyTooLarge(what, limit)
        parts.append(chunk)
    return b"".join(parts)


async def bounded_lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[str]:
    """The lines of a byte stream (decoded as UTF-8), refusing a line longer than `limit` bytes."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if len(line) > limit:
                raise ReplyTooLarge("a stream line", limit)
            yield line.decode("utf-8", "replace")
        if len(pending) > limit:
            raise ReplyTooLarge("a stream line", limit)
    if pending:
        yield pending.decode("utf-8", "replace")


def check_deadline(deadline_s: Optional[float]) -> None:
    """Refuse a --deadline that is not a positive number of seconds (None: no overall limit)."""
    if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        raise ConfigError(f"--deadline {deadline_s:g} must be a positive number of seconds",
                          "leave it out for no limit on a whole request")


async def within_deadline(coro, deadline_s: Optional[float]):
    """Await `coro`, raising DeadlineError after `deadline_s` seconds (None: no limit).

    An anyio cancel scope, not asyncio.wait_for: httpx reads inside anyio scopes of its own, which at times
    swallowed wait_for's cancellation (a trickling reply then ran to its end)."""
    if deadline_s is None:
        return await coro
    try:
        with anyio.fail_after(deadline_s):
            return await coro
    except TimeoutError:
        raise DeadlineError(deadline_s) from None


async def within_stall(chunks: AsyncIterator[T], stall_s) -> AsyncIterator[T]:
    """The items of `chunks`, raising StallError when the next one takes longer than `stall_s` (None: no limit;
    a callable: read before each wait, so a caller can arm the limit part-way). The wait is an anyio cancel scope,
    as in within_deadline."""
    iterator = chunks.__aiter__()
    while True:
        limit = stall_s() if callable(stall_s) else stall_s
        try:
            with anyio.fail_after(limit):  # None: no limit
                item = await iterator.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise StallError(limit) from None
        yield item


def check_api_base(api_base: str) -> str:
    """The server address without a trailing slash; refuse one without a scheme (httpx cannot send to it)."""
    if "://" not in api_base:
        raise ConfigError(f"--api-base {api_base} has no scheme", f"add http://, e.g. --api-base http://{api_base}")
    return api_base.rstrip("/")


def make_client(api_base: str, concurrency: Optional[int], timeout_s: float, *,
                keep_alive: bool = True) -> httpx.AsyncClient:
    """An async client whose pool never queues below `concurrency` (None: no limit), so that waiting in the
    client is never counted as server time. `keep_alive=False`: a new connection for every request, as
    bench_serving's aiohttp session per request has."""
    size = None if concurrency is None else concurrency + 4
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size if keep_alive else 0)
    return httpx.AsyncClient(base_url=api_base.rstrip("/"), timeout=httpx.Timeout(timeout_s), limits=limits, trust_env=False)


async def model_id(client: httpx.AsyncClient) -> str:
    """The first model id from `/v1/models` (what eval_model.py sends as `model`)."""
    return (await served_model(client))["id"]


async def served_model(client: httpx.AsyncClient) -> dict:
    """{id, root} of the first model `/v1/models` lists; SGLang's `root` is the model path it loaded (or None)."""
    try:
        async with client.stream("GET", "/v1/models", timeout=30) as response:
            body = await read_bounded(response.aiter_bytes(), MAX_MODELS_BYTES, "the /v1/models answer")
        response.raise_for_status()
        first = json.loads(body)["data"][0]
        root = first.get("root")
        model = {"id": str(first["id"]), "root": str(root) if root is not None else None}
    except httpx.HTTPError as exc:
        raise ServerError(f"no answer from {client.base_url}/v1/models ({exc.__class__.__name__}: {exc})",
                          "start the server first, or check --api-base") from None
    except ReplyTooLarge as exc:
        raise ServerError(f"{client.base_url}/v1/models: {exc}", "is this an SGLang server?") from None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        raise ServerError(f"{client.base_url}/v1/models lists no model", "is this an SGLang server?") from None
    if any(len(v or "") > MAX_MODEL_ID_CHARS for v in model.values()):
        raise ServerError(f"{client.base_url}/v1/models names a model id or path longer than {MAX_MODEL_ID_CHARS} "
                          "characters", "is this an SGLang server?")
    return model


MAX_SERVER_INFO_BYTES = 1 << 20  # SGLang's /get_server_info: the server args and internal states


async def server_info(client: httpx.AsyncClient) -> dict:
    """`GET /get_server_info`, as bench_serving asks it after each timed run (the answer's time is inside its
    duration). Never raises: {"status": HTTP status or None, "info": the JSON object or None, "error": ...}."""
    try:
        async with client.stream("GET", "/get_server_info", timeout=60) as response:
            body = await read_bounded(response.aiter_bytes(), MAX_SERVER_INFO_BYTES, "the /get_server_info answer")
        if response.status_code != 200:
            return {"status": response.status_code, "info": None, "error": f"HTTP {response.status_code}"}
        info = json.loads(body)
        if not isinstance(info, dict):
            raise TypeError(f"a JSON {type(info).__name__}, not an object")
        return {"status": 200, "info": info, "error": None}
    except (httpx.HTTPError, ReplyTooLarge) as exc:
        return {"status": None, "info": None, "error": f"{exc.__class__.__name__}: {exc}"}
    except (ValueError, TypeError, RecursionError) as exc:
        return {"status": 200, "info": None, "error": f"not a JSON object ({exc.__class__.__name__})"}


@dataclass
class ChatResult:
    content: Optional[str]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    latency_s: float
    error: Optional[str]


async def chat_completion(client: httpx.AsyncClient, model: str, question: str, max_tokens: int, stop: List[str],
                          stall_s: Optional[float] = None, deadline_s: Optional[float] = None) -> ChatResult:
    """One eval request; any failure (timeout, stall, deadline, HTTP error, bad or oversized body) comes back as
    `error`, never raised.

    `stall_s` bounds the silence once the reply has started (a body shorter than its Content-Length); the wait
    for the reply to start is the client's timeout, since a non-streamed answer starts only when it is complete.
    `deadline_s` bounds the whole request. The usage counts are capped: completion tokens at `max_tokens`."""
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stop": stop,
    }
    start = time.perf_counter()

    async def ask() -> tuple:
        async with client.stream("POST", "/v1/chat/completions", json=payload) as response:
            limit = MAX_REPLY_BYTES if response.status_code == 200 else MAX_ERROR_BYTES
            try:
                raw = await read_bounded(within_stall(response.aiter_bytes(), stall_s), limit, "the reply")
            except ReplyTooLarge:
                if response.status_code == 200:
                    raise
                raw = b"(an error body larger than 4 KiB)"
        return response.status_code, raw

    try:
        status, raw = await within_deadline(ask(), deadline_s)
        if status != 200:
            return ChatResult(None, None, None, time.perf_counter() - start,
                              f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}")
        body = json.loads(raw)
        content = body["choices"][0]["message"]["content"]
        if content is not None and not isinstance(content, str):
            raise TypeError(f"content is {type(content).__name__}, not a string")
        usage = body.get("usage") or {}
        if not isinstance(usage, dict):
            raise TypeError(f"usage is {type(usage).__name__}, not an object")
        return ChatResult(content, claimed_count(usage.get("prompt_tokens"), MAX_PROMPT_TOKENS),
                          claimed_count(usage.get("completion_tokens"), max_tokens), time.perf_counter() - start, None)
    except (StallError, DeadlineError, ReplyTooLarge) as exc:
        error = str(exc)
    except httpx.TimeoutException as exc:
        error = f"timeout ({exc.__class__.__name__})"
    except httpx.HTTPError as exc:
        error = f"{exc.__class__.__name__}: {exc}"
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        error = f"malformed reply ({exc.__class__.__name__}: {exc})"
    except RecursionError:
        error = "malformed reply (nested too deeply to read)"
    return ChatResult(None, None, None, time.perf_counter() - start, error)


@dataclass
class StreamResult:
    """One `/generate` request, timed the way bench_serving times it."""

    success: bool = False
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: List[float] = field(default_factory=list)
    start_s: float = 0.0
    end_s: float = 0.0
    error: Optional[str] = None
    claimed_tokens: int = 0  # the largest completion_tokens the server claimed, uncapped (output_tokens is capped)


async def stream_generate(client: httpx.AsyncClient, prompt: str, max_new_tokens: int,
                          stall_s: Optional[float] = None, deadline_s: Optional[float] = None) -> StreamResult:
    """POST /generate streaming; TTFT at the first chunk with text, ITL spread over the tokens each chunk adds.
    A stream silent for `stall_s` seconds once its first token came, or not done within `deadline_s` (None: no
    limit), fails the request. Before the first token the server may queue the request behind others' prefills
    for as long as it takes (bench_serving waits up to its 6 h timeout), so no stall limit applies there.
    A chunk's `completion_tokens` is capped at `max_new_tokens` (a peer's claim never sizes our memory); the
    largest claim is kept in `claimed_tokens`, so a server that streams more than asked is seen."""
    payload = {
        "text": prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        "stream": True,
        "return_logprob": False,
        "logprob_start_len": -1,
    }
    result = StreamResult(output_tokens=0)
    start = time.perf_counter()
    result.start_s = start

    async def stream() -> None:
        last_time = start
        last_tokens = 0
        async with client.stream("POST", "/generate", json=payload) as response:
            if response.status_code != 200:
                try:
                    body = await read_bounded(response.aiter_bytes(), MAX_ERROR_BYTES, "the error body")
                except ReplyTooLarge:
                    body = b"(an error body larger than 4 KiB)"
                result.error = f"HTTP {response.status_code}: {body.decode('utf-8', 'replace')[:200]}"
                return
            armed = lambda: stall_s if result.ttft_s else None  # noqa: E731 - no stall limit before the first token
            async for line in within_stall(bounded_lines(response.aiter_bytes(), MAX_LINE_BYTES), armed):
                line = line.strip()
                if not line:
                    continue
                chunk = line[len("data:"):].strip() if line.startswith("data:") else line
                if chunk == "[DONE]":
                    continue
                data = json.loads(chunk)
                if not data.get("text"):
                    continue
                now = time.perf_counter()
                claim = _chunk_claim(data["meta_info"]["completion_tokens"])
                result.claimed_tokens = max(result.claimed_tokens, claim)
                tokens = min(claim, max_new_tokens)
                if result.ttft_s == 0.0:
                    result.ttft_s = now - start
                else:
                    new = tokens - last_tokens
                    if new <= 0:
                        continue
                    result.itl_s.extend([(now - last_time) / new] * new)
                last_time, last_tokens = now, tokens
        result.output_tokens = last_tokens
        result.success = True

    try:
        await within_deadline(stream(), deadline_s)
    except (StallError, DeadlineError, ReplyTooLarge) as exc:
        result.error = str(exc)
    except httpx.TimeoutException as exc:
        result.error = f"timeout ({exc.__class__.__name__})"
    except httpx.HTTPError as exc:
        result.error = f"{exc.__class__.__name__}: {exc}"
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        result.error = f"malformed stream ({exc.__class__.__name__}: {exc})"
    except RecursionError:
        result.error = "malformed stream (a chunk nested too deeply to read)"
    finally:
        result.end_s = time.perf_counter()
        result.latency_s = result.end_s - start
    return result


async def flush_cache(client: httpx.AsyncClient) -> None:
    """POST /flush_cache, as `bench_serving --flush-cache` does before each tier's timed run."""
    try:
        response = await client.post("/flush_cache", timeout=60)
    except httpx.HTTPError as exc:
        raise ServerError(f"/flush_cache failed ({exc.__class__.__name__}: {exc})", "is the server still up?") from None
    if response.status_code >= 500:
        raise ServerError(f"/flush_cache answered HTTP {response.status_code}", "check the server log")
