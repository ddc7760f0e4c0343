"""The `soarpack` command: a thin Typer layer. Each area registers its commands from its own module."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.console import Console

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


def _register_all() -> None:
    # Each module adds its commands to `app`; imports stay inside the commands so `--help` is fast.
    from soarpack.cli import bench, bundle, quant, sala, serve  # noqa: F401


_register_all()


def main(argv: Optional[list] = None) -> None:
    try:
        app(args=argv, standalone_mode=True)
    except SoarpackError as exc:
        err_console.print(f"[bold red]error:[/] {exc.message}")
        if exc.hint:
            err_console.print(f"[yellow]hint:[/] {exc.hint}")
        sys.exit(exc.exit_code)
