"""The CLI's one output sink: a command returns its result (an `Output`) and the sink renders it on stdout (text,
or JSON with `--format json`), the libraries' events on stderr (soarpack.steps.Event), their amount set by the
global -q / -v the same way for every command.

    text (default)  the result as text; progress, notes and problems on stderr
    json            only the result's JSON on stdout (its warnings and verdict are in it); stderr holds progress
                    lines, and an error's lines
    -q              only problems and the result;  -v  every line the libraries emit
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import typer
from rich.markup import escape

from soarpack.errors import SoarpackError
from soarpack.printable import printable
from soarpack.steps import Event

QUIET, NORMAL, VERBOSE = 0, 1, 2


class Format(str, enum.Enum):
    text = "text"
    json = "json"


@dataclass
class _State:
    format: str = Format.text.value
    verbosity: int = NORMAL


STATE = _State()


class Verdict(SoarpackError):
    """A run that worked but whose result is a no-go (below the gate, incomplete): exit 1. With --format json the
    document says it, so no line on stderr repeats it."""

    exit_code = 1


@dataclass
class Output:
    """What a command returns: `data` for --format json; `text` a string, or a function that draws on the stdout
    console (tables); `verdict` raised after the result is shown (its exit code is the command's), or only an
    `exit_code`."""

    data: Any
    text: Union[str, Callable[[Any], None], None] = None
    verdict: Optional[SoarpackError] = None
    exit_code: int = 0  # a no-go that the result itself says (check's verdict line, diagnose's findings)


def show(output: Output) -> None:
    """Render a command's Output through the running command's sink, then raise its verdict."""
    data, verdict = output.data, output.verdict
    if verdict is not None and isinstance(data, dict):  # the document says why the exit code is not 0
        data = {**data, "verdict": {"message": verdict.message, "hint": verdict.hint, "exit_code": verdict.exit_code}}
    sink().result(data, output.text)
    if verdict is not None:
        raise verdict
    if output.exit_code:
        raise typer.Exit(output.exit_code)


def reset(fmt: Optional[str] = None, quiet: bool = False, verbose: bool = False) -> None:
    """Set by the root callback (`soarpack --format json -q CMD`) before every command."""
    from soarpack.cli import UsageError

    if quiet and verbose:
        raise UsageError("--quiet and --verbose exclude each other", "pick one")
    STATE.format = fmt or Format.text.value
    STATE.verbosity = QUIET if quiet else VERBOSE if verbose else NORMAL


def sink(quiet: bool = False, verbose: bool = False) -> "Sink":
    """The sink of the running command: the global --format / -q / -v (quantize's own -q / -v over them)."""
    from soarpack.cli import UsageError

    if quiet and verbose:
        raise UsageError("--quiet and --verbose exclude each other", "pick one")
    fmt = STATE.format
    verbosity = QUIET if quiet else VERBOSE if verbose else STATE.verbosity
    return Sink(fmt, verbosity)


_STATUS = {"pass": "[green]pass[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]skip[/]"}  # same visible width


class Sink:
    def __init__(self, fmt: str = Format.text.value, verbosity: int = NORMAL):
        from soarpack.cli import err_console

        self.format, self.verbosity, self.console = fmt, verbosity, err_console
        self._status = None

    @property
    def json(self) -> bool:
        return self.format == Format.json.value

    @property
    def chatty(self) -> bool:
        """Progress and notes are shown (text, not quiet)."""
        return not self.json and self.verbosity >= NORMAL

    def say(self, message: str) -> None:
        if self.chatty:
            self.console.print(printable(message), markup=False, highlight=False, soft_wrap=True)

    def problem(self, message: str, prefix: str = "warning") -> None:
        if self.json:
            return
        self.console.print(f"[yellow]{prefix}:[/] {escape(printable(message))}", highlight=False, soft_wrap=True)

    def note(self, message: str) -> None:
        """A library's `log` line (what cleaning up after a killed run did, say) as `note: MESSAGE`, but in JSON."""
        if not self.json:
            self.console.print(f"note: {escape(printable(message))}", highlight=False, soft_wrap=True)

    def event(self, event: Event) -> None:
        """Render one library event on stderr."""
        if event.kind == "problem":
            return self.problem(event.message)
        if not self.chatty:
            return
        if event.kind == "start":
            self._stop_status()
            if self.console.is_terminal:
                self._status = self.console.status(f"running: {escape(event.phase)} ...")
                self._status.start()
            else:  # a log or CI: a line, so that a hanging step is named
                self.say(f"running: {event.phase} ...")
        elif event.kind == "end" and event.result is not None:
            self._stop_status()
            self.step_line(event.result)
        elif event.kind == "end" and self.verbosity >= VERBOSE:  # a message: it did not finish (interrupted, failed)
            self.say(f"{event.phase} {event.message} after {event.seconds:.1f}s" if event.message
                     else f"{event.phase} {event.seconds:.1f}s")
        elif event.kind == "info":
            self.console.print(f"[dim]{escape(printable(event.message))}[/]", highlight=False, soft_wrap=True)
        elif event.kind == "progress" and self.verbosity >= VERBOSE:
            self.say(f"{event.phase}: {event.done}/{event.total} {event.message}".rstrip())

    def step_line(self, result: Any) -> None:
        from soarpack.imagestack import describe_versions

        detail = f"  {printable(result.detail)}" if result.detail else ""
        ran_on = f"  [dim]({describe_versions(result.versions)})[/]" if result.versions else ""
        self.console.print(f"{_STATUS[result.status]} {escape(result.name):<16} {result.seconds:6.1f} s{escape(detail)}"
                           f"{ran_on}", highlight=False, soft_wrap=True)

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def close(self) -> None:
        self._stop_status()

    def result(self, data: Any, text: Union[str, Callable[[Any], None], None] = None) -> None:
        """The command's result on stdout: its JSON, or its text (a string, or drawn on the stdout console)."""
        self.close()
        if self.json:
            typer.echo(json.dumps(data, indent=2, default=str))
        elif callable(text):
            from rich.console import Console

            text(Console())  # the tables quote names from files and servers: they pass them through printable
        elif text is not None:
            typer.echo(printable(text, keep="\n"))  # names and values from files, servers, the environment
