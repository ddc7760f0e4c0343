"""Rendering of `soarpack quantize`'s progress events on stderr: phase lines, and a bar with ETA per GPTQ layer."""

from __future__ import annotations

from typing import Any, Optional

from rich.console import Console
from rich.text import Text
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class QuantizeProgress:
    def __init__(self) -> None:
        self.console = Console(stderr=True)
        self.bar: Optional[Progress] = None
        self.task: Any = None

    def __enter__(self) -> "QuantizeProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_bar()

    def render(self, event: Any) -> None:
        if event.kind == "layer":
            self._layer(event.layer, event.layers)
        elif event.kind == "phase-start":
            self.console.print(f"[bold]{event.phase}[/] ...", highlight=False)
        elif event.kind == "phase-end":
            self._stop_bar()
            self.console.print(f"[bold]{event.phase}[/] {event.seconds:.1f}s", highlight=False)
        elif event.kind == "problem":
            self.console.print(Text.assemble(("problem ", "red"), event.message), highlight=False)
        else:
            self.console.print(event.message, highlight=False, markup=False)

    def _layer(self, i: int, n: int) -> None:
        if self.bar is None:
            self.bar = Progress(TextColumn("gptq layer {task.completed}/{task.total}"), BarColumn(),
                                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                console=self.console, transient=True)
            self.task = self.bar.add_task("gptq", total=n)
            self.bar.start()
        self.bar.update(self.task, completed=i)

    def _stop_bar(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
