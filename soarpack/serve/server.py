"""The platform's server, started as the platform starts it (SALA.md §1), and the accuracy gate's arithmetic.

`launch_command` / `start_server` start `python -m sglang.launch_server` on a checkpoint the way the platform does
(SALA.md §1) and wait for /health; `gate_line` says C with its margin to the full-credit line
(soarpack.facts.scoring). soarpack.rehearse.server runs the whole rehearsal as steps.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from soarpack.errors import ConfigError, SoarpackError
from soarpack.facts import launch, limits, scoring as platform_scoring
from soarpack.steps import EventCallback, lines_to, no_events

PLATFORM_PORT = launch.PORT
READY_TIMEOUT_S = limits.SERVER_READY_S
STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 15
PROGRESS_EVERY_S = 10.0
# What the platform appends after SGLANG_SERVER_ARGS (SALA.md §1); flags after ours win.
PLATFORM_TRAILING_ARGS = launch.TRAILING_ARGS
# The platform's own SGLANG_SERVER_ARGS when a bundle exports none.
PLATFORM_DEFAULT_ARGS = launch.DEFAULT_SERVER_ARGS
# The platform's launch line as its shell runs it: SGLANG_SERVER_ARGS expanded unquoted, so it is split at
# whitespace and globbed; soarpack.serve.lint refuses every token that would not survive that.
PLATFORM_LAUNCH_LINE = " ".join(["python -m", launch.MODULE, *launch.leading_args("$OUT"), "${SGLANG_SERVER_ARGS}",
                                 *launch.TRAILING_ARGS])


class ServerError(SoarpackError):
    """The server did not start, died, or never became healthy."""


def launch_command(ckpt: os.PathLike, server_args: Sequence[str], port: int, python: str = sys.executable) -> List[str]:
    return [python, "-m", launch.MODULE, *launch.server_argv(str(ckpt), list(server_args), port)]


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
                 env: Optional[Dict[str, str]] = None, on_event: EventCallback = no_events,
                 poll_s: float = 1.0) -> Server:
    """Start the server and wait until GET /health answers 200; raise ServerError with its log's last lines.

    A port that already accepts connections is refused before anything starts: the health wait would otherwise pass
    at once on whatever listens there (a server an earlier run left behind, say) and every later step would measure
    that server. The server is stopped when the wait ends in anything but health (Ctrl-C, SIGTERM under
    `terminate_raises`, a timeout)."""
    log = lines_to(on_event, "server start")
    if port_in_use(port):
        raise ServerError(f"port {port} on 127.0.0.1 already accepts connections: another server (perhaps one an "
                          f"earlier run left) would be measured instead of this checkpoint",
                          f"stop what listens there (`fuser -k {port}/tcp` on Linux) or pass another --port")
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
    try:
        return _wait_healthy(server, timeout_s, log, poll_s)
    except BaseException:
        server.stop()
        raise


def _wait_healthy(server: Server, timeout_s: float, log, poll_s: float) -> Server:
    proc, url, log_path = server.proc, server.url, server.log_path
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
            raise ServerError(f"the server was not healthy after {timeout_s:.0f} s (the platform allows about "
                              f"{READY_TIMEOUT_S / 60:.0f} min); last log lines: {_log_tail(log_path)}",
                              f"full log: {log_path}")
        if elapsed >= next_progress:
            log(f"waiting for the server on {url}: {elapsed:.0f} s of {timeout_s:.0f} s")
            next_progress += PROGRESS_EVERY_S
        time.sleep(poll_s)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


@contextmanager
def terminate_raises() -> Iterator[None]:
    """While active, SIGTERM raises SystemExit(143) in the main thread, so that `finally` blocks stop the server they
    started (Python's default SIGTERM ends the process at once and leaves the server, in its own session, running
    with the GPU). A no-op off the main thread, where no handler can be installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_exit(signum, _frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the accuracy gate ---------------------------------------------------------------------------------------


def c_cliff_ori() -> float:
    """The ori_accuracy above which C = 1 (derived in soarpack.facts.scoring from the baseline and C's steps)."""
    return platform_scoring.FULL_CREDIT_ORI


def gate_line(ori: float, rows: int, records: Optional[Sequence[dict]] = None) -> str:
    """C, the margin to the cliff in points and the 95 % interval of a slice of `rows` rows: stratified by task
    when the scored `records` are given, else binomial (soarpack.bench.scoring.Gate)."""
    from soarpack.bench.scoring import c_factor, gate_of_records, gate_of_total, overall_accuracy

    gate = gate_of_records(records) if records else gate_of_total(ori, rows)
    how = "stratified by task" if gate.stratified else "binomial"
    return (f"expected C = {c_factor(overall_accuracy(ori))}: ori_accuracy {ori:.2f}, margin {ori - gate.line:+.2f} "
            f"points to the {gate.line:g} cliff (95% interval {gate.low:.2f}-{gate.high:.2f}, {how}, {gate.rows} rows: "
            f"{gate.verdict}; identical BF16 runs vary by 2-3 points)")


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
