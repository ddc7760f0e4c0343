"""The HTTP requests the platform sends to an SGLang server, as async httpx calls.

Request bodies copy `eval_model.py` (chat completions) and `sglang.bench_serving --backend sglang` (`/generate`),
so a server sees locally what it will see on the platform.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, List, Optional, TypeVar

import httpx

from soarpack.errors import ConfigError, SoarpackError


class ServerError(SoarpackError):
    """The server cannot be reached or does not answer like an SGLang server."""


class StallError(Exception):
    """A reply started but then sent no byte for `stall_s` seconds."""

    def __init__(self, stall_s: float):
        super().__init__(f"stalled: no byte for {stall_s:g} s")


T = TypeVar("T")


async def within_stall(chunks: AsyncIterator[T], stall_s: Optional[float]) -> AsyncIterator[T]:
    """The items of `chunks`, raising StallError when the next one takes longer than `stall_s` (None: no limit)."""
    iterator = chunks.__aiter__()
    while True:
        try:
            item = await asyncio.wait_for(iterator.__anext__(), stall_s)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            raise StallError(stall_s) from None
        yield item


def check_api_base(api_base: str) -> str:
    """The server address without a trailing slash; refuse one without a scheme (httpx cannot send to it)."""
    if "://" not in api_base:
        raise ConfigError(f"--api-base {api_base} has no scheme", f"add http://, e.g. --api-base http://{api_base}")
    return api_base.rstrip("/")


def make_client(api_base: str, concurrency: Optional[int], timeout_s: float) -> httpx.AsyncClient:
    """An async client whose pool never queues below `concurrency` (None: no limit), so that waiting in the
    client is never counted as server time."""
    size = None if concurrency is None else concurrency + 4
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    return httpx.AsyncClient(base_url=api_base.rstrip("/"), timeout=httpx.Timeout(timeout_s), limits=limits, trust_env=False)


async def model_id(client: httpx.AsyncClient) -> str:
    """The first model id from `/v1/models` (what eval_model.py sends as `model`)."""
    return (await served_model(client))["id"]


async def served_model(client: httpx.AsyncClient) -> dict:
    """{id, root} of the first model `/v1/models` lists; SGLang's `root` is the model path it loaded (or None)."""
    try:
        response = await client.get("/v1/models", timeout=30)
        response.raise_for_status()
        first = response.json()["data"][0]
        root = first.get("root")
        return {"id": str(first["id"]), "root": str(root) if root is not None else None}
    except httpx.HTTPError as exc:
        raise ServerError(f"no answer from {client.base_url}/v1/models ({exc.__class__.__name__}: {exc})",
                          "start the server first, or check --api-base") from None
    except (KeyError, IndexError, TypeError, ValueError):
        raise ServerError(f"{client.base_url}/v1/models lists no model", "is this an SGLang server?") from None


@dataclass
class ChatResult:
    content: Optional[str]
    prompt_tokens: Optional[int]
    completion_tokens: Optional[int]
    latency_s: float
    error: Optional[str]


async def chat_completion(client: httpx.AsyncClient, model: str, question: str, max_tokens: int, stop: List[str],
                          stall_s: Optional[float] = None) -> ChatResult:
    """One eval request; any failure (timeout, stall, HTTP error, bad body) comes back as `error`, never raised.

    `stall_s` bounds the silence once the reply has started (a body shorter than its Content-Length); the wait
    for the reply to start is the client's timeout, since a non-streamed answer starts only when it is complete."""
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stop": stop,
    }
    start = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=payload) as response:
            raw = b"".join([chunk async for chunk in within_stall(response.aiter_bytes(), stall_s)])
        if response.status_code != 200:
            return ChatResult(None, None, None, time.perf_counter() - start,
                              f"HTTP {response.status_code}: {raw[:200].decode('utf-8', 'replace')}")
        body = json.loads(raw)
        content = body["choices"][0]["message"]["content"]
        if content is not None and not isinstance(content, str):
            raise TypeError(f"content is {type(content).__name__}, not a string")
        usage = body.get("usage") or {}
        return ChatResult(content, usage.get("prompt_tokens"), usage.get("completion_tokens"), time.perf_counter() - start, None)
    except StallError as exc:
        error = str(exc)
    except httpx.TimeoutException as exc:
        error = f"timeout ({exc.__class__.__name__})"
    except httpx.HTTPError as exc:
        error = f"{exc.__class__.__name__}: {exc}"
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        error = f"malformed reply ({exc.__class__.__name__}: {exc})"
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


async def stream_generate(client: httpx.AsyncClient, prompt: str, max_new_tokens: int,
                          stall_s: Optional[float] = None) -> StreamResult:
    """POST /generate streaming; TTFT at the first chunk with text, ITL spread over the tokens each chunk adds.
    A stream silent for `stall_s` seconds (None: no limit) fails the request."""
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
    last_time = start
    last_tokens = 0
    try:
        async with client.stream("POST", "/generate", json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")
                result.error = f"HTTP {response.status_code}: {body[:200]}"
                return result
            async for line in within_stall(response.aiter_lines(), stall_s):
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
                tokens = int(data["meta_info"]["completion_tokens"])
                if result.ttft_s == 0.0:
                    result.ttft_s = now - start
                else:
                    new = tokens - last_tokens
                    if new == 0:
                        continue
                    result.itl_s.extend([(now - last_time) / new] * new)
                last_time, last_tokens = now, tokens
        result.output_tokens = last_tokens
        result.success = True
    except StallError as exc:
        result.error = str(exc)
    except httpx.TimeoutException as exc:
        result.error = f"timeout ({exc.__class__.__name__})"
    except httpx.HTTPError as exc:
        result.error = f"{exc.__class__.__name__}: {exc}"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        result.error = f"malformed stream ({exc.__class__.__name__}: {exc})"
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
