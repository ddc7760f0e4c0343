"""Rendering of `soarpack quantize`'s progress events on the terminal's stderr: one bar with an ETA.

The bar names the phase in progress and, during GPTQ, counts layers with a remaining-time estimate. It writes to a
copy of stderr taken before the run starts, so it stays on the terminal while the run sends the libraries' own
output to its log file (soarpack.quant.capture). verbosity 0: only fallbacks and problems; 1: the bar; 2: also a
line per phase and step.
"""

from __future__ import annotations

import io
import os
import sys
from typing import Any, Optional, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from soarpack.printable import printable


def terminal_stderr() -> TextIO:
    """A stream to where stderr goes now, immune to a later redirection of file descriptor 2."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # an in-memory stream (tests): not redirected
        return sys.stderr
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace")


class QuantizeProgress:
    def __init__(self, verbosity: int = 1) -> None:
        self.verbosity = verbosity
        self.stream = terminal_stderr()
        self.console = Console(file=self.stream)
        self.bar: Optional[Progress] = None
        self.task: Any = None

    def __enter__(self) -> "QuantizeProgress":
        if self.verbosity >= 1:
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                console=self.console, transient=True)
            self.task = self.bar.add_task("quantize", total=None, count="")
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        self.console.file.flush()
        if self.stream is not sys.stderr:
            self.stream.close()

    def say(self, line: str) -> None:
        self.console.print(printable(line), highlight=False, markup=False)

    def render(self, event: Any) -> None:
        if event.kind == "problem":
            self.console.print(Text.assemble(("note: " if event.phase != "verify" else "problem: ", "yellow"),
                                             printable(event.message)), highlight=False)
            return
        if self.bar is not None:
            if event.kind == "start":
                self.bar.update(self.task, description=event.phase)
            elif event.kind == "progress":
                self.bar.update(self.task, total=event.total, completed=event.done,
                                count=f"layer {event.done + 1}/{event.total}")
            elif event.kind == "end" and event.phase == "gptq":
                self.bar.update(self.task, completed=self.bar.tasks[0].total or 0, count="")
        if self.verbosity >= 2:
            if event.kind == "end":
                self.console.print(f"[bold]{event.phase}[/] {event.seconds:.1f}s", highlight=False)
            elif event.kind in ("info", "progress"):
                self.console.print(printable(event.message), highlight=False, markup=False)
