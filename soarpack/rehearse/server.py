"""`soarpack rehearse-server CKPT --profile P --data public.jsonl`: the platform's server step on a GPU box, as steps.

Starts `python -m sglang.launch_server` on the checkpoint the way the platform does (SALA.md §1), waits for it to
be healthy, evaluates a stratified slice of the public set, runs a short bench, stops the server (its log is kept)
and scores: the expected accuracy gate C with its margin to the full-credit line.

Tested here against a stand-in `sglang` package (soarpack/serve/fake_server.py behind `sglang.launch_server`); run
once against the fork's real server on the lent H200, dense variant, 32-layer random W4 checkpoint
(benchmarks/gpu_serve/results/2026-12-01-served-32L/rehearsal.json).
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from soarpack.errors import ConfigError
from soarpack.facts import limits
from soarpack.measure.scoring import gate_line
from soarpack.serve.server import PLATFORM_PORT, READY_TIMEOUT_S, Server, launch_command, start_server, terminate_raises
from soarpack.steps import Done, EventCallback, Runner, RunReport, StepFailed, lines_to, no_events, step


@dataclass
class Serving:
    """What the steps share."""

    ckpt: Path
    out_dir: Path
    command: List[str]
    port: int
    rows: List[dict]
    slice_path: Path
    speed_path: Path
    bench_rows: int
    ready_timeout_s: float
    eval_timeout_s: float
    max_tokens: Optional[int]
    env: Optional[Dict[str, str]]
    on_event: EventCallback
    server: Optional[Server] = None
    eval: Dict[str, Any] = field(default_factory=dict)
    bench: Dict[str, Any] = field(default_factory=dict)
    score: Dict[str, Any] = field(default_factory=dict)
    exit_code: Optional[int] = None


@step("server start")
def server_start(s: Serving) -> Done:
    lines_to(s.on_event, "server start")(f"starting: {' '.join(s.command)}")
    s.server = start_server(s.command, s.port, s.out_dir / "server.log", timeout_s=s.ready_timeout_s, env=s.env,
                            on_event=s.on_event)
    return Done(f"healthy on {s.server.url} after {s.server.ready_s:.0f} s",
                {"url": s.server.url, "ready_s": round(s.server.ready_s or 0.0, 1), "log": str(s.server.log_path)})


@step("eval", needs=["server start"])
def evaluate(s: Serving) -> Done:
    from soarpack.measure.evaluate import EvalConfig, run_eval

    cap = {} if s.max_tokens is None else {"max_tokens": s.max_tokens}
    cfg = EvalConfig(api_base=s.server.url, data=s.slice_path, output=s.out_dir / "eval.json", model_dir=s.ckpt,
                     timeout_s=s.eval_timeout_s, **cap)
    s.eval = run_eval(cfg)
    data = {k: s.eval[k] for k in ("scored", "total", "ori_accuracy", "overall_accuracy", "c_factor", "complete")}
    data["errors"] = len(s.eval["errors"])
    data["max_tokens"] = cfg.max_tokens
    capped = "" if s.max_tokens is None else (f"; answers cut at {cfg.max_tokens} tokens (--max-tokens; the platform "
                                              f"allows {limits.EVAL_MAX_TOKENS}): not the platform's accuracy")
    return Done(f"{s.eval['scored']}/{s.eval['total']} rows, {len(s.eval['errors'])} error(s), "
                f"ori_accuracy {s.eval['ori_accuracy']:.2f}{capped}", data)


@step("bench", needs=["server start"])
def bench(s: Serving) -> Done:
    from soarpack.measure.speed import BenchConfig, run_bench

    s.bench = run_bench(BenchConfig(api_base=s.server.url, tiers={t: s.speed_path for t in ("s1", "s8", "smax")},
                                    model_dir=s.ckpt, output=s.out_dir / "bench.json"))
    tiers = s.bench.get("tiers", {})
    durations = {name: float(t["duration_s"]) for name, t in tiers.items()}
    failed = [name for name, t in tiers.items() if t.get("failed")]
    return Done(f"{s.bench_rows} short rows: " + ", ".join(f"{k} {v:.1f} s" for k, v in durations.items())
                + (f" ({', '.join(failed)} had failed requests)" if failed else ""),
                {"durations_s": durations, "failed_tiers": failed})


def exit_text(code: Optional[int]) -> str:
    """-9 reads "-9 (SIGKILL)": the real server ends its own process tree with SIGKILL after our SIGTERM."""
    if code is None or code >= 0:
        return str(code)
    try:
        return f"{code} ({signal.Signals(-code).name})"
    except ValueError:
        return str(code)


@step("server stop", needs=["server start"])
def server_stop(s: Serving) -> Done:
    s.exit_code = s.server.stop()
    return Done(f"exit code {exit_text(s.exit_code)}; log kept at {s.server.log_path}",
                {"exit_code": s.exit_code, "log": str(s.server.log_path)})


@step("score", needs=["eval", "bench"], gates=True)
def score(s: Serving) -> Done:
    from soarpack.measure.competition import final_score
    from soarpack.placement.write import atomic_write_json

    durations = {name: float(t["duration_s"]) for name, t in s.bench.get("tiers", {}).items()}
    # Speed against this run itself (S = 100 per tier): a short bench is no match for the platform's best.
    s.score = final_score(durations, durations, s.eval["overall_accuracy"])
    atomic_write_json(s.out_dir / "score.json", s.score)
    gate = gate_line(s.eval["ori_accuracy"], s.eval["scored"],
                     [r for r in s.eval.get("rows", []) if r.get("index", 0) < s.eval["total"]])
    if s.max_tokens is not None:  # the verdict must not read as the platform's: the answers were cut short
        gate += f" (answers cut at {s.max_tokens} tokens by --max-tokens: not the platform's accuracy)"
    data = {"c_factor": s.eval["c_factor"], "ori_accuracy": s.eval["ori_accuracy"], "gate": gate,
            "final_score": s.score.get("final_score")}
    failed = [name for name, t in s.bench.get("tiers", {}).items() if t.get("failed")]
    problems = ([] if s.eval["complete"] and not s.eval["errors"] else ["the eval had failed requests"]) + \
        ([f"{', '.join(failed)} had failed requests"] if failed else []) + \
        ([] if s.eval["c_factor"] == 1.0 else [f"C = {s.eval['c_factor']}, below full credit"])
    if problems:
        raise StepFailed(f"{'; '.join(problems)}; {gate}", problems=problems, **data)
    return Done(gate, data)


STEPS = [server_start, evaluate, bench, server_stop, score]


@dataclass
class RehearsalResult:
    ok: bool
    summary: str
    gate: str
    out_dir: Path
    log_path: Path
    report: RunReport
    eval: Dict = field(default_factory=dict)
    bench: Dict = field(default_factory=dict)
    score: Dict = field(default_factory=dict)
    exit_code: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary, "gate": self.gate, "out_dir": str(self.out_dir),
                "log": str(self.log_path), "exit_code": self.exit_code, "score": self.score,
                "versions": self.report.versions, "steps": [r.to_dict() for r in self.report.steps]}


SHORT_BENCH_MAX_OUTPUT = 256  # tokens per answer of the short bench, at most


def check_settings(*, port: int, per_task: int, bench_rows: int, ready_timeout_s: float, eval_timeout_s: float,
                   max_tokens: Optional[int]) -> None:
    """Every setting, before anything is read, started or written: a NaN wait would never end, and the short
    bench's answers cannot be shorter than the speed set's shortest (bench_serving drops rows under 2 tokens)."""
    from soarpack.measure.speedset import MIN_TOKENS
    from soarpack.serve.server import check_port, check_wait

    check_port(port)
    check_wait(ready_timeout_s, "--ready-timeout")
    check_wait(eval_timeout_s, "the eval timeout")
    for flag, value in (("--per-task", per_task), ("--bench-rows", bench_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} {value!r} is not a count", f"pass {flag} N with N of 1 or more")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < MIN_TOKENS):
        raise ConfigError(f"--max-tokens {max_tokens!r} is below the short bench's shortest answer ({MIN_TOKENS} "
                          "tokens: the speed set keeps no shorter row)", f"pass --max-tokens {MIN_TOKENS} or more")


def rehearse_server(ckpt: os.PathLike, profile: str, data: os.PathLike, out_dir: os.PathLike, *,
                    port: int = PLATFORM_PORT, python: str = sys.executable, per_task: int = 6, bench_rows: int = 8,
                    ready_timeout_s: float = READY_TIMEOUT_S, eval_timeout_s: float = limits.EVAL_TIMEOUT_S,
                    max_tokens: Optional[int] = None, env: Optional[Dict[str, str]] = None,
                    on_event: EventCallback = no_events) -> RehearsalResult:
    """Start the server on `ckpt` with `profile`'s args, eval a stratified slice of `data`, bench briefly, score.

    `max_tokens` caps every answer, the eval's and the short bench's: a random-weight model never stops early, so a
    rehearsal of the steps on one fits a short GPU lease; its accuracy then says nothing about the platform's."""
    from soarpack.measure import speedset as ss
    from soarpack.measure.evaluate import load_eval_rows
    from soarpack.measure.tokenizer import load_tokenizer
    from soarpack.recipe.profile import load_profile
    from soarpack.serve.server import stratified_slice

    ckpt, data, out_dir = Path(ckpt), Path(data), Path(out_dir)
    check_settings(port=port, per_task=per_task, bench_rows=bench_rows, ready_timeout_s=ready_timeout_s,
                   eval_timeout_s=eval_timeout_s, max_tokens=max_tokens)
    if not (ckpt / "config.json").is_file():
        raise ConfigError(f"{ckpt} is not a model directory (no config.json)", "pass the quantized checkpoint")
    prof = load_profile(profile)
    rows = stratified_slice(load_eval_rows(data), per_task)
    out_dir.mkdir(parents=True, exist_ok=True)
    slice_path = ss.write_jsonl(out_dir / "eval-slice.jsonl", rows)
    out_hi = SHORT_BENCH_MAX_OUTPUT if max_tokens is None else min(SHORT_BENCH_MAX_OUTPUT, max_tokens)
    short_mix = {"input": (ss.Bucket(16, 2048, 1.0),), "output": (ss.Bucket(min(16, out_hi - 1), out_hi, 1.0),)}
    speed_rows, _ = ss.make_speedset(load_tokenizer(ckpt), bench_rows, short_mix, seed=1)
    speed_path = ss.write_jsonl(out_dir / "speed-short.jsonl", speed_rows)

    ctx = Serving(ckpt, out_dir, launch_command(ckpt, prof.args, port, python), port, rows, slice_path, speed_path,
                  bench_rows, ready_timeout_s, eval_timeout_s, max_tokens, env, on_event)
    with terminate_raises():
        try:
            report = Runner(STEPS, on_event).run(ctx)
        finally:
            if ctx.server is not None:  # never leave a server behind, nor a child of one whose leader exited
                ctx.server.stop()
    gate = report["score"].data.get("gate", "")
    summary = "; ".join(f"{r.name} {r.status}: {r.detail}" for r in report.steps if r.name != "server stop" or r.status != "pass")
    return RehearsalResult(report.ok and not report.gate()["not_run"], summary, gate, out_dir, out_dir / "server.log",
                           report, ctx.eval, ctx.bench, ctx.score, ctx.exit_code)
