"""Where a quantize run's output goes while it lasts: the caller's events, the `--log` file, the libraries' own output.

`run_output()` is the with-block around the run. Events go to the caller's callback, delivered with the caller's
own streams (soarpack.quant.capture.caller_streams: a callback that prints reaches the caller's stdout, not the
log), and, when asked, as plain timestamped lines to the log file (`LogFile`), where the libraries' own output also
goes (`capture`; nowhere without a log file).

A phase that raises ends with its cause (`gptq interrupted after 26.0s`, not a finished phase's `gptq 26.0s`), and
the log's last line says how the run ended. A run refused in its setup phase (a mistyped recipe, a missing model, an
existing output) did no work: the log it created is removed, not left as a stray file. A full disk, met by the log
or by a library writing into it, is one error line.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional

from soarpack.errors import SoarpackError
from soarpack.steps import Event, EventCallback, no_events

SETUP_PHASE = "check"


class Position:
    """Where the run is, from its events: the phase in progress (or the one that raised), the phases finished."""

    def __init__(self) -> None:
        self.current: Optional[str] = None
        self.finished: List[str] = []  # the phases that ended without an error
        self.layer_at: Optional[tuple] = None  # the last GPTQ layer started: (index, layers)
        self.in_setup = True  # until a phase other than the setup phase starts: then a log stays, whatever happens
        self.t0 = time.perf_counter()

    def event(self, event: Event) -> None:
        if event.kind == "start":
            self.current, self.layer_at = event.phase, None
        elif event.kind == "progress":
            self.layer_at = (event.done, event.total)
        elif event.kind == "end" and not event.message:
            self.current = None
            self.finished.append(event.phase)

    def where(self) -> str:
        return (f"in {self.current}" if self.current else f"after {self.finished[-1]}" if self.finished
                else "at the start")


class LogFile:
    """The run's events as plain lines of a log file, and a last line saying how a run that raised ended."""

    def __init__(self, path: Path, fh: Any, created: bool, position: Position):
        self.path, self.fh, self.created, self.position = path, fh, created, position

    def event(self, event: Event) -> None:
        end = f"{event.phase} {event.message} after {event.seconds:.1f}s" if event.message \
            else f"{event.phase} {event.seconds:.1f}s"
        self._write({"start": f"{event.phase} ...", "end": end}.get(event.kind, event.message))

    def refused_in_setup(self) -> bool:
        return self.position.in_setup and self.created

    def last_line(self, exc: BaseException) -> None:
        at = self.position
        where = at.where() + (f" at layer {at.layer_at[0] + 1}/{at.layer_at[1]}" if at.current == "gptq"
                              and at.layer_at else "")
        how = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else "failed"
        cause = "" if isinstance(exc, KeyboardInterrupt) else f": {ended_by(exc)}"
        with contextlib.suppress(OSError):  # a full disk: the run's own error is the one to show
            self._write(f"run {how} {where}, {time.perf_counter() - at.t0:.1f}s after it started{cause}")

    def _write(self, text: str) -> None:
        """One line of ours, on a line of its own even when a library left a bar unfinished in the file."""
        self.fh.flush()
        fd = self.fh.fileno()
        size = os.fstat(fd).st_size
        first = "\n" if size and os.pread(fd, 1, size - 1) != b"\n" else ""
        self.fh.write(f"{first}{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        self.fh.flush()


class RunOutput:
    """What `run_output` yields: `event` (the one callback of the run), and once the block is over, the libraries'
    warning count."""

    def __init__(self, on_event: EventCallback, log: Optional[LogFile], position: Position):
        self._caller, self.log, self.position = on_event, log, position
        self.captured: Any = None  # soarpack.quant.capture.Captured while the libraries' output is captured

    def event(self, event: Event) -> None:
        if event.kind == "start" and event.phase != SETUP_PHASE:
            self.position.in_setup = False  # the work starts: its log stays, whatever happens next
        if self.captured is None:
            self._caller(event)
        else:
            from soarpack.quant.capture import caller_streams

            with caller_streams():
                self._caller(event)
        if self.log is not None:
            self.log.event(event)
        self.position.event(event)  # last: a start the log could not take did not start

    @property
    def library_warnings(self) -> Optional[int]:
        """Warning lines the libraries wrote to the log (final once the block is over); None: not captured."""
        return None if self.captured is None or self.log is None else self.captured.warnings


@contextlib.contextmanager
def run_output(log_file: Optional[Path], on_event: Optional[EventCallback],
               capture: bool = False) -> Iterator[RunOutput]:
    from soarpack.placement.checks import is_disk_full
    from soarpack.quant.capture import library_output_to

    stack = contextlib.ExitStack()
    failure: Optional[BaseException] = None
    with stack.pop_all() as opening:  # a failure while opening closes what was opened
        log, position = None, Position()
        if log_file:
            created = not os.path.exists(log_file)
            log = LogFile(Path(log_file), opening.enter_context(open(log_file, "a+", encoding="utf-8")), created,
                          position)
            # after the capture below is closed: nothing comes after it
            opening.callback(lambda: log.last_line(failure) if failure is not None and not log.refused_in_setup()
                             else None)
        out = RunOutput(on_event or no_events, log, position)
        if capture:  # without a log file the libraries' output goes nowhere: a library call prints nothing
            out.captured = opening.enter_context(library_output_to(Path(log_file or os.devnull)))
        stack = opening.pop_all()
    try:
        yield out
    except BaseException as exc:
        failure = exc
    closing: Optional[OSError] = None
    try:
        stack.close()  # the log and the libraries' capture: a full disk can refuse their last flush
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        closing = exc
    if failure is None:
        if closing is not None:  # the output is in place; only the log's last lines are lost
            out._caller(Event("problem", "done", f"the log {log_file} is incomplete: its last lines did not fit on "
                                                 f"the device ({closing.strerror or closing})"))
        return
    removed = False
    if log is not None and log.refused_in_setup():
        with contextlib.suppress(OSError):
            os.unlink(log.path)
            removed = True
    full = None if isinstance(failure, SoarpackError) else disk_full_cause(failure)
    if full is None:  # the run's own one-line error (an output refused for a full disk among them) stays the one shown
        raise failure
    incomplete = f"; the log {log_file} is incomplete" if log is not None and not removed else ""
    what = getattr(full, "filename", None) or "a write"
    raise SoarpackError(f"no space left on the device {position.where()} ({what} failed){incomplete}",
                        "free disk space where the log and the output go, and run again; nothing was "
                        "replaced") from full


def disk_full_cause(exc: BaseException) -> Optional[BaseException]:
    """The exception, or one it was raised from or during, that says the disk is full; None when none does."""
    from soarpack.placement.checks import is_disk_full

    seen = 0
    while exc is not None and seen < 16:
        if is_disk_full(exc):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def ended_by(exc: BaseException) -> str:
    """An exception as the one line a log or a terminal says about it."""
    text = exc.message if isinstance(exc, SoarpackError) else f"{type(exc).__name__}: {exc}"
    return (text.strip().splitlines() or [type(exc).__name__])[0]
