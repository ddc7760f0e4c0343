"""How much of a measured bench duration is ours: the client's throughput against a zero-delay server.

The scripted test server (soarpack/serve/fake_server.py) runs in a child process and answers at once, so every
second spent is either the client's or the stdlib server's. Reported per case: requests/s, streamed chunks/s,
and the client process's own CPU time per request (the server's CPU is not in it). A platform tier runs for
hundreds of seconds; compare its duration with `requests × client ms/request` to see that the client is noise.

    .venv/bin/python benchmarks/client_overhead.py [--requests 400] [--tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _serve(url_queue, stop_event) -> None:
    from soarpack.serve.fake_server import ChatReply, FakeSGLang

    with FakeSGLang(chat=lambda q: ChatReply("</think>ANSWER: A")) as server:
        url_queue.put(server.url)
        stop_event.wait()


def _measure(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def bench_generate(url: str, requests: int, tokens: int, concurrency):
    from soarpack.measure import client as http
    from soarpack.measure.speed import SpeedRequest, run_tier

    reqs = [SpeedRequest(f"prompt {i}", 2, tokens) for i in range(requests)]
    warm = [SpeedRequest("warm", 2, 2)] * (concurrency or 32)

    async def go():
        async with http.make_client(url, None, 600) as client:
            # open the pool's connections first so connects are not counted
            await run_tier(client, warm, concurrency, warmup=False, flush_cache=False, settle_s=0)
            return await run_tier(client, reqs, concurrency, warmup=False, flush_cache=False, settle_s=0)

    return _measure(lambda: asyncio.run(go()))


def bench_eval(url: str, requests: int, concurrency: int):
    from soarpack.measure.evaluate import EvalConfig, run_eval

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "d.jsonl"
        data.write_text("".join(f'{{"task": "mcq", "question": "q{i}", "gold": "A"}}\n' for i in range(requests)))
        return _measure(lambda: run_eval(EvalConfig(api_base=url, data=data, output=None, concurrency=concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--tokens", type=int, default=16, help="streamed tokens per /generate request (one chunk each)")
    parser.add_argument("--long-tokens", type=int, default=4096, help="tokens per request in the long-output case")
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    ctx = mp.get_context("spawn")
    url_queue, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(url_queue, stop), daemon=True)
    server.start()
    try:
        url = url_queue.get(timeout=60)
        table = Table(title=f"client overhead vs a zero-delay server ({args.requests} requests, {args.tokens} tokens each)")
        for col in ("case", "conc.", "wall s", "req/s", "chunks/s", "client CPU ms/req", "failed"):
            table.add_column(col, justify="right")
        cases = [("generate S1", 1, args.requests, args.tokens), ("generate S8", 8, args.requests, args.tokens),
                 ("generate Smax", None, args.requests, args.tokens),
                 # long outputs: SGLang resends the cumulative text in every chunk, so parsing grows with length
                 (f"generate S8, {args.long_tokens} tok", 8, 16, args.long_tokens)]
        for name, conc, n, tokens in cases:
            tier, wall, cpu = bench_generate(url, n, tokens, conc)
            table.add_row(name, str(conc or "∞"), f"{wall:.2f}", f"{n / wall:.0f}", f"{n * tokens / wall:.0f}",
                          f"{1000 * cpu / n:.2f}", str(tier["failed"]))
        report, wall, cpu = bench_eval(url, args.requests, 32)
        table.add_row("eval chat", "32", f"{wall:.2f}", f"{args.requests / wall:.0f}", "-",
                      f"{1000 * cpu / args.requests:.2f}", str(len(report["errors"])))
        Console().print(table)
    finally:
        stop.set()
        server.join(timeout=10)


if __name__ == "__main__":
    main()
