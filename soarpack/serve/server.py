"""The platform's server step on a GPU box: `soarpack rehearse-server CKPT --profile P --data public.jsonl`.

Starts `python -m sglang.launch_server` on the checkpoint the way the platform does (SALA.md §1), waits for it to
be healthy, runs `soarpack eval` on a stratified slice of the public set, a short bench and `score`, reports the
expected accuracy gate C with its margin to the 79.2 cliff, stops the server and keeps its log.

Tested here against a stand-in `sglang` package only (tests/fake_sglang_server.py behind `sglang.launch_server`);
nobody here has run it against the real server.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from soarpack.errors import ConfigError, SoarpackError

PLATFORM_PORT = 30000
READY_TIMEOUT_S = 600.0  # the platform gives the server about 10 minutes
STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 15
PROGRESS_EVERY_S = 10.0
# What the platform appends after SGLANG_SERVER_ARGS (SALA.md §1); flags after ours win.
PLATFORM_TRAILING_ARGS = ("--tp-size", "1", "--max-running-requests", "32", "--enable-metrics")


class ServerError(SoarpackError):
    """The server did not start, died, or never became healthy."""


def launch_command(ckpt: os.PathLike, server_args: Sequence[str], port: int, python: str = sys.executable) -> List[str]:
    return [python, "-m", "sglang.launch_server", "--model-path", str(ckpt), "--trust-remote-code", "--port", str(port),
            *server_args, *PLATFORM_TRAILING_ARGS]


def _log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    tail = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(tail) if tail else "(empty log)"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class Server:
    """A running `sglang.launch_server` in its own process group, logging to `log_path`."""

    proc: subprocess.Popen
    url: str
    log_path: Path
    command: List[str]
    ready_s: Optional[float] = None

    def stop(self, grace_s: float = STOP_GRACE_S) -> Optional[int]:
        """SIGTERM the server's process group, SIGKILL it after `grace_s`; return the exit code."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=grace_s)
        return self.proc.returncode


def start_server(command: Sequence[str], port: int, log_path: Path, *, timeout_s: float = READY_TIMEOUT_S,
                 env: Optional[Dict[str, str]] = None, log: Callable[[str], None] = print,
                 poll_s: float = 1.0) -> Server:
    """Start the server and wait until GET /health answers 200; raise ServerError with its log's last lines."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log_fh:
        try:
            proc = subprocess.Popen(list(command), stdout=log_fh, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        except OSError as exc:  # a --python that does not exist or cannot run
            raise ServerError(f"cannot start {command[0]} ({exc.strerror or exc})",
                              "pass --python the interpreter that has the SGLang fork installed") from None
    server = Server(proc, url, log_path, list(command))
    t0 = time.monotonic()
    next_progress = PROGRESS_EVERY_S
    while True:
        elapsed = time.monotonic() - t0
        if proc.poll() is not None:
            raise ServerError(f"the server exited with code {proc.returncode} after {elapsed:.0f} s, before it was "
                              f"healthy; last log lines: {_log_tail(log_path)}", f"full log: {log_path}")
        if _healthy(url):
            server.ready_s = elapsed
            log(f"server healthy on {url} after {elapsed:.0f} s")
            return server
        if elapsed >= timeout_s:
            server.stop()
            raise ServerError(f"the server was not healthy after {timeout_s:.0f} s (the platform allows about "
                              f"{READY_TIMEOUT_S / 60:.0f} min); last log lines: {_log_tail(log_path)}",
                              f"full log: {log_path}")
        if elapsed >= next_progress:
            log(f"waiting for the server on {url}: {elapsed:.0f} s of {timeout_s:.0f} s")
            next_progress += PROGRESS_EVERY_S
        time.sleep(poll_s)


# -- the accuracy gate ---------------------------------------------------------------------------------------


def c_cliff_ori() -> float:
    """The ori_accuracy above which C = 1: overall > 99 with overall = ori / baseline · 100 (79.2 for 80)."""
    from soarpack.bench.scoring import BASELINE_ACCURACY

    return round(99.0 * BASELINE_ACCURACY / 100.0, 4)


def gate_line(ori: float, rows: int) -> str:
    """C, the margin to the cliff in points and in standard errors of a slice of `rows` rows."""
    from soarpack.bench.scoring import c_factor, overall_accuracy

    cliff = c_cliff_ori()
    margin = ori - cliff
    p = min(max(ori / 100.0, 0.0), 1.0)
    stderr = 100.0 * math.sqrt(p * (1 - p) / rows) if rows else float("inf")
    spread = f"{margin / stderr:+.1f} standard errors of a {rows}-row slice" if stderr > 0 else f"{rows} rows"
    return (f"expected C = {c_factor(overall_accuracy(ori))}: ori_accuracy {ori:.2f}, margin {margin:+.2f} points to "
            f"the {cliff} cliff ({spread}; identical BF16 runs vary by 2-3 points)")


# -- the rehearsal -------------------------------------------------------------------------------------------


def stratified_slice(rows: Sequence[dict], per_task: int) -> List[dict]:
    """The first `per_task` rows of each task, in file order."""
    taken: Dict[str, int] = {}
    out = []
    for row in rows:
        if taken.get(row["task"], 0) < per_task:
            taken[row["task"]] = taken.get(row["task"], 0) + 1
            out.append(row)
    return out


@dataclass
class RehearsalResult:
    ok: bool
    summary: str
    gate: str
    out_dir: Path
    log_path: Path
    eval: Dict = field(default_factory=dict)
    bench: Dict = field(default_factory=dict)
    score: Dict = field(default_factory=dict)
    exit_code: Optional[int] = None


def rehearse_server(ckpt: os.PathLike, profile: str, data: os.PathLike, out_dir: os.PathLike, *,
                    port: int = PLATFORM_PORT, python: str = sys.executable, per_task: int = 6, bench_rows: int = 8,
                    ready_timeout_s: float = READY_TIMEOUT_S, eval_timeout_s: float = 3000.0,
                    env: Optional[Dict[str, str]] = None, log: Callable[[str], None] = print) -> RehearsalResult:
    """Start the server on `ckpt` with `profile`'s args, eval a stratified slice of `data`, bench briefly, score."""
    from soarpack.bench import speedset as ss
    from soarpack.bench.competition import final_score
    from soarpack.bench.evaluate import EvalConfig, load_eval_rows, run_eval
    from soarpack.bench.speed import BenchConfig, run_bench
    from soarpack.bench.tokenizer import load_tokenizer
    from soarpack.fsutil import atomic_write_json
    from soarpack.serve.profiles import load_profile

    ckpt, data, out_dir = Path(ckpt), Path(data), Path(out_dir)
    if not (ckpt / "config.json").is_file():
        raise ConfigError(f"{ckpt} is not a model directory (no config.json)", "pass the quantized checkpoint")
    prof = load_profile(profile)
    rows = stratified_slice(load_eval_rows(data), per_task)
    out_dir.mkdir(parents=True, exist_ok=True)
    slice_path = ss.write_jsonl(out_dir / "eval-slice.jsonl", rows)
    short_mix = {"input": (ss.Bucket(16, 2048, 1.0),), "output": (ss.Bucket(16, 256, 1.0),)}
    speed_rows, _ = ss.make_speedset(load_tokenizer(ckpt), bench_rows, short_mix, seed=1)
    speed_path = ss.write_jsonl(out_dir / "speed-short.jsonl", speed_rows)

    command = launch_command(ckpt, prof.args, port, python)
    log(f"starting: {' '.join(command)}")
    server = start_server(command, port, out_dir / "server.log", timeout_s=ready_timeout_s, env=env, log=log)
    try:
        log(f"eval: {len(rows)} rows ({per_task} per task) of {data}")
        ev = run_eval(EvalConfig(api_base=server.url, data=slice_path, output=out_dir / "eval.json", model_dir=ckpt,
                                 timeout_s=eval_timeout_s))
        log(f"bench: {bench_rows} short rows on S1, S8 and Smax")
        bench = run_bench(BenchConfig(api_base=server.url, tiers={t: speed_path for t in ("s1", "s8", "smax")},
                                      tokenizer_dir=ckpt, output=out_dir / "bench.json"))
    finally:
        code = server.stop()
        log(f"server stopped (exit code {code}); log kept at {server.log_path}")
    durations = {name: float(t["duration_s"]) for name, t in bench.get("tiers", {}).items()}
    # Speed against this run itself (S = 100 per tier): a short bench is no match for the platform's best.
    score = final_score(durations, durations, ev["overall_accuracy"])
    atomic_write_json(out_dir / "score.json", score)
    gate = gate_line(ev["ori_accuracy"], ev["scored"])
    failed = [name for name, t in bench.get("tiers", {}).items() if t.get("failed")]
    ok = ev["complete"] and not ev["errors"] and not failed and ev["c_factor"] == 1.0
    summary = (f"server ready in {server.ready_s:.0f} s; eval {ev['scored']}/{ev['total']} rows, "
               f"{len(ev['errors'])} error(s); bench " + ", ".join(f"{k} {v:.1f} s" for k, v in durations.items())
               + (f" ({', '.join(failed)} had failed requests)" if failed else "") + f"; {gate}")
    return RehearsalResult(ok, summary, gate, out_dir, server.log_path, ev, bench, score, code)
