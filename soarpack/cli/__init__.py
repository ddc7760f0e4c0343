"""The `soarpack` command: a thin Typer layer. Each area registers its commands from its own module."""

from __future__ import annotations

import functools
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.text import Text

from soarpack import __version__
from soarpack.errors import SoarpackError

app = typer.Typer(
    name="soarpack",
    help="Quantize MiniCPM-SALA, package a SOAR submission, and measure it before you upload.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"soarpack {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Quantize MiniCPM-SALA, package a SOAR submission, and measure it before you upload."""


def fail(exc: SoarpackError) -> "typer.Exit":
    """Print a SoarpackError as one cause line plus a hint; return the Exit to raise."""
    # Messages quote user text (paths, keys, `[table]` names): Text keeps their brackets out of rich's markup.
    err_console.print(Text.assemble(("error:", "bold red"), " ", exc.message), highlight=False)
    if exc.hint:
        err_console.print(Text.assemble(("hint:", "yellow"), " ", exc.hint), highlight=False)
    return typer.Exit(exc.exit_code)


def handle_errors(fn):
    """Decorate a command so a SoarpackError becomes a clear message and exit code 2 (also under CliRunner)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SoarpackError as exc:
            raise fail(exc) from None

    return wrapper


def command(*args, **kwargs):
    """`@app.command()` with SoarpackError handling: the one way commands are declared."""
    return _command_on(app, *args, **kwargs)


def _command_on(typer_app: typer.Typer, *args, **kwargs):
    def deco(fn):
        return typer_app.command(*args, **kwargs)(handle_errors(fn))

    return deco


def subcommand(typer_app: typer.Typer, *args, **kwargs):
    """The same as `command`, for a sub-app (`soarpack sglang apply`)."""
    return _command_on(typer_app, *args, **kwargs)


def _register_all() -> None:
    # Each module adds its commands to `app`; imports stay inside the commands so `--help` is fast.
    from soarpack.cli import bench, bundle, quant, sala, serve  # noqa: F401


_register_all()


def main(argv: Optional[list] = None) -> None:
    try:
        app(args=argv, standalone_mode=True)
    except SoarpackError as exc:  # raised outside a command (option callbacks)
        raise SystemExit(fail(exc).exit_code) from None
