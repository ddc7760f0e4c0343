"""Rendering of `soarpack quantize`'s progress events on stderr: a live bar on a terminal, plain lines elsewhere.

On a terminal the bar names the phase in progress and, during GPTQ, counts layers with a remaining-time estimate.
Off a terminal (nohup, CI, the platform's `tee`) a live display would print nothing until the end, so each phase's
start and end is a line, a GPTQ layer is a line at most every PLAIN_LAYER_EVERY_S (the first always), and a phase
that says nothing for PLAIN_SILENCE_MAX_S gets a `still running` line: a long run is never silent for minutes.

Everything is written to a copy of stderr taken before the run starts, so it stays on the terminal (or the pipe)
while the run sends the libraries' own output to its log file (soarpack.quant.capture). verbosity 0: only
fallbacks and problems; 1: the bar or the plain lines; 2: also a line per step and every GPTQ layer.

A Ctrl-C ends the block with one line saying where the run stopped and what became of OUT, then the log's path,
and exit code 130.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from soarpack.printable import printable

PLAIN_LAYER_EVERY_S = 10.0
PLAIN_SILENCE_MAX_S = 30.0
INTERRUPTED_EXIT_CODE = 130  # a shell's code for a run ended by SIGINT


def terminal_stderr() -> TextIO:
    """A stream to where stderr goes now, immune to a later redirection of file descriptor 2."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # an in-memory stream (tests): not redirected
        return sys.stderr
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")


class QuantizeProgress:
    def __init__(self, verbosity: int = 1, out_dir: Optional[Path] = None, log: Optional[Path] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.verbosity, self.out_dir, self.log, self.clock = verbosity, out_dir, log, clock
        self.stream = terminal_stderr()
        self.console = _ProgressConsole(file=self.stream)
        self.plain = not self.console.is_terminal
        self.bar: Optional[Progress] = None
        self.task: Any = None
        self.phase: Optional[str] = None  # the phase in progress, or the one that raised
        self.layer: Optional[tuple] = None  # the last GPTQ layer started: (index, layers)
        self.t0 = self.last_line = clock()
        self._last_layer_line: Optional[float] = None
        self._started = False
        self._out_before = _identity(out_dir)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch: Optional[threading.Thread] = None

    def __enter__(self) -> "QuantizeProgress":
        self.t0 = self.last_line = self.clock()
        self._out_before = _identity(self.out_dir)
        if self.verbosity >= 1 and not self.plain:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                console=self.console, transient=True)
            self.task = self.bar.add_task("quantize", total=None, count="")
            self.bar.start()
        elif self.verbosity >= 1:
            self._watch = threading.Thread(target=self._watch_silence, name="quantize-progress", daemon=True)
            self._watch.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=5)
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        try:
            if isinstance(exc, KeyboardInterrupt):
                self.say(self.interrupted_line())
                self.say(f"log: {self.log}" if self.log and self.log.is_file() else
                         "log: none kept (the run was stopped before it started its work)")
            elif exc is not None and self.log and self.log.is_file():
                self.say(f"log: {self.log}")  # a run refused before it started its work keeps no log
        finally:
            with contextlib.suppress(OSError):
                self.console.file.flush()
                if self.stream is not sys.stderr:
                    self.stream.close()
        if isinstance(exc, KeyboardInterrupt):
            import typer

            raise typer.Exit(INTERRUPTED_EXIT_CODE) from None

    def say(self, line: str) -> None:
        self._print(printable(line), markup=False)

    def _print(self, renderable: Any, **kw: Any) -> None:
        """Print under the lock; a closed pipe (the reader of a `| tee` or `| head` went away) must not stop the
        run it reports on: what cannot be shown is dropped."""
        with self._lock:
            try:
                self.console.print(renderable, highlight=False, soft_wrap=True, **kw)
            except OSError:  # rich hands a broken pipe to on_broken_pipe; any other failed write lands here
                pass
            self.last_line = self.clock()

    def position(self) -> Optional[str]:
        """The phase in progress (`gptq at layer 3/8`), or None between phases."""
        if self.phase == "gptq" and self.layer:
            return f"gptq at layer {self.layer[0] + 1}/{self.layer[1]}"
        return self.phase

    def where(self) -> str:
        position = self.position()
        return f"in {position}" if position else "between phases" if self._started else "before its first phase"

    def interrupted_line(self) -> str:
        elapsed = self.clock() - self.t0
        return f"interrupted {self.where()}, {elapsed:.1f} s after it started: {self._what_became_of_out()}"

    def _what_became_of_out(self) -> str:
        if self.out_dir is None:
            return "the output is written only when a run finishes"
        now = _identity(self.out_dir)
        if now is None:
            return f"nothing was written to {self.out_dir}"
        if now == self._out_before:
            return f"{self.out_dir} was left as it was (it is replaced only when a run finishes)"
        return f"{self.out_dir} was written before the interrupt (the run had finished its phases)"

    def render(self, event: Any) -> None:
        if event.kind == "problem":
            self._print(Text.assemble(("note: " if event.phase != "verify" else "problem: ", "yellow"),
                                      printable(event.message)))
            return
        if event.kind == "start":
            self.phase, self.layer, self._started = event.phase, None, True
        elif event.kind == "progress":
            self.layer = (event.done, event.total)
        if self.bar is not None:
            if event.kind == "start":
                self.bar.update(self.task, description=event.phase)
            elif event.kind == "progress":
                self.bar.update(self.task, total=event.total, completed=event.done,
                                count=f"layer {event.done + 1}/{event.total}")
            elif event.kind == "end" and event.phase == "gptq":
                self.bar.update(self.task, completed=self.bar.tasks[0].total or 0, count="")
        if self.plain and self.verbosity >= 1:
            self._plain_line(event)
        elif self.verbosity >= 2:
            if event.kind == "end":
                state = f" {event.message} after" if event.message else ""  # `gptq interrupted after 26.0s`
                self._print(f"[bold]{event.phase}[/]{state} {event.seconds:.1f}s")
            elif event.kind in ("info", "progress"):
                self.say(event.message)
        if event.kind == "end" and not event.message:
            self.phase = self.layer = None

    def _plain_line(self, event: Any) -> None:
        if event.kind == "start":
            self._last_layer_line = None
            self.say(f"quantize: {event.phase} ...")
        elif event.kind == "end" and event.message:  # interrupted, failed: not a finished phase
            self.say(f"quantize: {event.phase} {event.message} after {event.seconds:.1f} s")
        elif event.kind == "end":
            self.say(f"quantize: {event.phase} done in {event.seconds:.1f} s")
        elif event.kind == "progress":
            now = self.clock()
            if (self.verbosity >= 2 or self._last_layer_line is None
                    or now - self._last_layer_line >= PLAIN_LAYER_EVERY_S):
                self._last_layer_line = now
                self.say(f"quantize: {event.message}")
        elif event.kind == "info" and self.verbosity >= 2:
            self.say(event.message)

    def tick(self) -> None:
        """Off a terminal: a `still running` line when the phase in progress said nothing for a while."""
        position = self.position()
        if not (self.plain and self.verbosity >= 1) or position is None:
            return
        if self.clock() - self.last_line >= PLAIN_SILENCE_MAX_S:
            self.say(f"quantize: {position}: still running, {self.clock() - self.t0:.0f} s after the start")

    def _watch_silence(self) -> None:
        while not self._stop.wait(1.0):
            self.tick()


class _ProgressConsole(Console):
    def on_broken_pipe(self) -> None:
        """rich exits the process here; a quantize whose reader went away (`| head`, a dead tee) goes on unseen."""
        self.quiet = True


def _identity(path: Optional[Path]) -> Optional[tuple]:
    """What tells one folder from its replacement: a finished run renames a new folder into place."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
