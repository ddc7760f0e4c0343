"""Send what the libraries print (GPTQModel's banners, bars and tables, torch and transformers warnings, nvcc and
Triton output) to a log file instead of the terminal, for the duration of a with-block.

Both levels are redirected: Python's `sys.stdout`/`sys.stderr` (what Python code prints, warnings included) and
the process's file descriptors 1 and 2 (C extensions, subprocesses, logging handlers made earlier on the real
stderr). Everything is restored on exit. Whoever still wants to reach the terminal keeps a stream opened before
(see soarpack.cli.progress), or writes inside `caller_streams()`: the caller's own streams, there (an `on_event`
callback that prints is the caller's code, not a library's).

The redirect is the process's, so captures that overlap (two quantize runs on two threads) share it: the first
saves the streams, the last restores them, and in between `sys.stdout`/`sys.stderr` route each write by thread
(a thread that opened a capture writes to its own log; any other thread, and fds 1 and 2, to the newest capture's).

On exit the block's `Captured` counts the warning lines the libraries wrote (`count_library_warnings`), so the
terminal can say `N library warnings: LOG` instead of showing them.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, TextIO

# What a library's warning line looks like, anywhere in a line (GPTQModel's bars redraw in front of its log lines):
WARNING_LINE = re.compile(
    r"(?:^|\s)[WE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ "  # torch's glog-style W/E lines: `W1201 12:02:37.46 24217 ...`
    r"|(?:^|[\s|\]%])(?:WARN|WARNING|ERROR|CRITICAL)\b[ :]"  # GPTQModel's `WARN  ...`, logging's `WARNING: ...`
    r"|\w*Warning: "  # Python's warnings: `file.py:726: FutureWarning: ...`
    r"|Failed to load \S"  # torchao's logger.warning about its optional CUDA extensions
)
# soarpack's own lines in the same log (soarpack.quant.logfile) start with a timestamp: not a library's.
OWN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def count_library_warnings(lines: Iterable[str]) -> int:
    return sum(1 for line in lines if not OWN_LINE.match(line) and WARNING_LINE.search(line))


@dataclass
class Captured:
    """Where the libraries' output went, and (once the block is over) how many warning lines they wrote there."""

    log_file: Path
    warnings: int = 0

    def line(self) -> str:
        return f"{self.warnings} library warning{'s' if self.warnings != 1 else ''}: {self.log_file}"


COUNT_LINE = re.compile(r"^(\d+) library warnings?: (.+)$", re.M)  # what Captured.line() writes


def count_said(output: str) -> "tuple[int, str] | None":
    """(N, LOG) from the last `N library warnings: LOG` line a run printed (a subprocess's stdout), else None."""
    found = COUNT_LINE.findall(output)
    return (int(found[-1][0]), found[-1][1].strip()) if found else None


def _count_from(log_file: Path, offset: int) -> int:
    if not log_file.is_file():  # os.devnull: nothing kept, nothing to count
        return 0
    with open(log_file, "r", encoding="utf-8", errors="replace", newline="\n") as fh:
        fh.seek(offset)
        return count_library_warnings(fh)


@contextlib.contextmanager
def library_output_to(log_file: Path) -> Iterator[Captured]:
    fh = open(log_file, "a", buffering=1, encoding="utf-8", errors="replace")
    captured = Captured(Path(log_file))
    offset = os.fstat(fh.fileno()).st_size
    _REDIRECT.enter(fh)
    try:
        yield captured
    finally:
        _REDIRECT.leave(fh)
        with contextlib.suppress(OSError):
            captured.warnings = _count_from(captured.log_file, offset)


@contextlib.contextmanager
def caller_streams() -> Iterator[None]:
    """In this block, this thread's `sys.stdout`/`sys.stderr` writes reach the streams the caller had before any
    capture began (the terminal, a notebook, pytest's capture), not a log."""
    before = getattr(_LOCAL, "outside", False)
    _LOCAL.outside = True
    try:
        yield
    finally:
        _LOCAL.outside = before
        for stream in _REDIRECT.caller:
            with contextlib.suppress(Exception):
                stream.flush()


_LOCAL = threading.local()  # per thread: `own` (the logs of the captures it opened), `outside` (caller_streams)


class _Routed:
    """What `sys.stdout` (or `sys.stderr`) is while a capture lasts: each write goes where its thread's goes."""

    def __init__(self, index: int):
        self._index = index  # 0: stdout, 1: stderr

    def _target(self) -> Any:
        return _REDIRECT.target(self._index)

    def write(self, text: str) -> int:
        target = self._target()
        try:
            return target.write(text)
        except ValueError:  # that capture's log was closed between the choice and the write: the next one's
            if not getattr(target, "closed", False):
                raise
            return self._target().write(text)

    def flush(self) -> None:
        with contextlib.suppress(ValueError):
            self._target().flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...: the target's
        return getattr(self._target(), name)


class _Redirect:
    """The process's one redirect, shared by the captures open at a time (under a lock)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.logs: List[TextIO] = []  # the open captures' logs, oldest first; fds 1 and 2 point at the newest
        self.saved_fds: Dict[int, int] = {}  # copies of fds 1 and 2 as they were before the first capture
        self.streams: Optional[tuple] = None  # sys.stdout, sys.stderr as they were before the first capture
        self.caller: List[TextIO] = []  # where caller_streams() writes: the saved streams, or fd copies of them
        self.routed = (_Routed(0), _Routed(1))

    def target(self, index: int) -> Any:
        own = getattr(_LOCAL, "own", None)
        with self.lock:
            if not self.logs:  # every capture is over (a handler kept this stream): where it wrote before
                return (self.streams or (sys.__stdout__, sys.__stderr__))[index]
            if getattr(_LOCAL, "outside", False):
                return self.caller[index]
            return own[-1] if own else self.logs[-1]

    def enter(self, fh: TextIO) -> None:
        with self.lock:
            if not self.logs:
                self._start()
            self.logs.append(fh)
            self._point_fds()
            _LOCAL.own = [*getattr(_LOCAL, "own", []), fh]

    def leave(self, fh: TextIO) -> None:
        with self.lock:
            with contextlib.suppress(Exception):
                fh.flush()
            self.logs.remove(fh)
            _LOCAL.own = [f for f in getattr(_LOCAL, "own", []) if f is not fh]
            if self.logs:
                self._point_fds()
            else:
                self._stop()
            fh.close()

    def _start(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        self.streams = (sys.stdout, sys.stderr)
        self.saved_fds = {}
        for fd in (1, 2):
            try:
                self.saved_fds[fd] = os.dup(fd)
            except OSError:  # no such descriptor (a daemon): nothing to redirect
                continue
        self.caller = [self._callers(stream, fd) for stream, fd in zip(self.streams, (1, 2))]
        sys.stdout, sys.stderr = self.routed

    def _callers(self, stream: Any, fd: int) -> Any:
        """The caller's stream as it can still be reached: itself, or (when it writes to fd 1 or 2, which now lead
        to a log) a stream on the copy of that descriptor."""
        try:
            writes_to_fd = stream.fileno() == fd
        except Exception:  # an in-memory stream (pytest's capture, a notebook): not redirected
            writes_to_fd = False
        if not writes_to_fd or fd not in self.saved_fds:
            return stream
        return open(self.saved_fds[fd], "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                    errors="replace", closefd=False)

    def _point_fds(self) -> None:
        for fd in self.saved_fds:
            os.dup2(self.logs[-1].fileno(), fd)

    def _stop(self) -> None:
        for stream in self.caller:
            with contextlib.suppress(Exception):
                stream.flush()
        if self.streams is not None and sys.stdout is self.routed[0] and sys.stderr is self.routed[1]:
            sys.stdout, sys.stderr = self.streams
        for fd, copy in self.saved_fds.items():
            os.dup2(copy, fd)
        for stream, saved in zip(self.caller, self.streams or ()):
            if stream is not saved:
                with contextlib.suppress(Exception):
                    stream.close()  # closefd=False: the descriptor copy is closed below
        for copy in self.saved_fds.values():
            os.close(copy)
        self.saved_fds, self.caller = {}, []


_REDIRECT = _Redirect()
