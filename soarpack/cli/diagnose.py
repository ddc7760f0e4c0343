"""CLI of soarpack.diagnose: `soarpack diagnose LOG_OR_DIR...`. Logic lives in soarpack.diagnose."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from soarpack.cli import command
from soarpack.cli.output import sink
from soarpack.printable import printable

def render(diagnosis) -> List[str]:
    """The human report (soarpack.diagnose.report): its lines are already printable."""
    from soarpack.diagnosis.report import render as report_lines

    return report_lines(diagnosis)


def _print_catalogue(as_json: bool) -> None:
    from dataclasses import asdict

    from soarpack.diagnosis.catalogue import load_catalogue

    entries = load_catalogue()
    if sink(as_json).json:
        typer.echo(json.dumps([{"id": e.id, "title": e.title, "severity": e.severity, "kinds": list(e.kinds),
                                "patterns": [p.pattern for p in e.patterns], "unverified": e.unverified,
                                "sources": [asdict(s) for s in e.sources]} for e in entries], indent=2))
        return
    for e in entries:
        typer.echo(f"{e.id}  [{e.severity}]  {e.title}" + ("  UNVERIFIED" if e.unverified else ""))
        for s in e.sources:
            typer.echo(f"    source: {s.kind} {s.where}")
    typer.echo(f"{len(entries)} entries, {sum(e.unverified for e in entries)} unverified")


@command("diagnose")
def diagnose_cmd(
    # Described in the docstring: Typer prints a list argument's type as `<list[Path]>`.
    paths: Optional[List[Path]] = typer.Argument(None, metavar="LOG_OR_DIR", hidden=True),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON."),
    catalogue: bool = typer.Option(False, "--catalogue", help="List the known failures and the source of each "
                                                             "signature instead."),
) -> None:
    """Name the known failures in a run's logs and results, with their cause and fix.

    LOG_OR_DIR are logs (prepare_env.log, prepare_model.log, quantize.log, a server log), soarpack eval/bench
    JSON, or folders of them (a kept `soarpack check` folder). The failures and their signatures are a catalogue (soarpack/diagnose/catalogue.toml), each citing where its
    text comes from. A log no known failure explains gets its first error and last traceback. Exit 0: nothing
    found; 1: a known failure; 2: bad input.

    Example:

    \b
      soarpack diagnose logs/ eval.json
      soarpack diagnose --catalogue
    """
    from soarpack import api

    if catalogue:
        _print_catalogue(sink(as_json).json)
        return
    diagnosis = api.diagnose(paths)
    if sink(as_json).json:
        typer.echo(json.dumps(diagnosis.to_dict(), indent=2))
    else:
        for line in render(diagnosis):
            typer.echo(printable(line))  # log lines and file names are outside text (render escapes them too)
    raise typer.Exit(diagnosis.exit_code)


__all__ = ["diagnose_cmd", "render"]
