"""The platform's server, started as the platform starts it (SALA.md §1).

`launch_command` / `start_server` start `python -m sglang.launch_server` on a checkpoint the way the platform does
(SALA.md §1) and wait for /health. soarpack.rehearse.server runs the whole rehearsal as steps; the accuracy gate's
line is soarpack.measure.scoring.gate_line.
"""

from __future__ import annotations

import math
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
from soarpack.facts import launch, limits
from soarpack.steps import EventCallback, lines_to, no_events

PLATFORM_PORT = launch.PORT
READY_TIMEOUT_S = limits.SERVER_READY_S
STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 15
PROGRESS_EVERY_S = 10.0
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

    stopped: bool = False  # the whole process group is gone (stop() ran to the end)

    def stop(self, grace_s: float = STOP_GRACE_S) -> Optional[int]:
        """SIGTERM the server's process group; once the group is empty or `grace_s` has passed, SIGKILL it, whether
        or not the leader still lives (a child that ignores SIGTERM outlives a leader that obeys it); return the
        leader's exit code. A second call does nothing (the group id could be reused once it is empty)."""
        if self.stopped:
            return self.proc.returncode
        pgid = self.proc.pid  # start_new_session: the leader's pid is the group's id
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _group_alive(pgid, self.proc) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(pgid, signal.SIGKILL)  # whatever is left, leader or not
        self._reap(grace_s)
        while _group_alive(pgid, self.proc) and time.monotonic() < deadline + grace_s:
            time.sleep(0.05)  # SIGKILL is delivered asynchronously: wait until the group is really gone
        self.stopped = True
        return self.proc.returncode

    def _reap(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # SIGKILL cannot be ignored; only a process stuck in the kernel stays
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group (or only what we may not signal)


def _group_alive(pgid: int, leader: subprocess.Popen) -> bool:
    """Whether any process of the group still runs. The leader is reaped here when it exits (a zombie leader would
    keep the group alive); a zombie child, reparented, is not ours to reap and counts as gone."""
    leader.poll()
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc"):  # no way to tell a zombie from a live process: the group lives
        return True
    return any(_state(pid) not in ("Z", "X", None) for pid in _group_pids(pgid))


def _group_pids(pgid: int) -> List[int]:
    """The pids of the group, from /proc (Linux); [pgid] where /proc cannot tell."""
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return [pgid]
    out = []
    for pid in pids:
        try:
            if os.getpgid(pid) == pgid:
                out.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return out


def _state(pid: int) -> Optional[str]:
    """The process state letter from /proc/PID/stat ("R", "S", "Z", ...); "?" where /proc cannot tell, None when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        return "?"


def start_server(command: Sequence[str], port: int, log_path: Path, *, timeout_s: float = READY_TIMEOUT_S,
                 env: Optional[Dict[str, str]] = None, on_event: EventCallback = no_events,
                 poll_s: float = 1.0) -> Server:
    """Start the server and wait until GET /health answers 200; raise ServerError with its log's last lines.

    A port that already accepts connections is refused before anything starts: the health wait would otherwise pass
    at once on whatever listens there (a server an earlier run left behind, say) and every later step would measure
    that server. The server is stopped when the wait ends in anything but health (Ctrl-C, SIGTERM under
    `terminate_raises`, a timeout)."""
    log = lines_to(on_event, "server start")
    check_wait(timeout_s, "--ready-timeout")
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


def check_wait(seconds: float, flag: str) -> float:
    """A wait in seconds: a finite number > 0 (a NaN compares false with every elapsed time: it would never end)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"{flag} {seconds!r} is not a time in seconds", f"pass {flag} SECONDS, a number > 0")
    return float(seconds)


def check_port(port: int, flag: str = "--port") -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"{flag} {port!r} is not a TCP port", f"pass {flag} N with N from 1 to 65535")
    return port


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
