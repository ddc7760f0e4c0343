"""CLI of soarpack.diagnose: `soarpack diagnose LOG_OR_DIR...`. Logic lives in soarpack.diagnose."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import List, Optional

import typer

from soarpack.cli import command
from soarpack.cli.output import sink
from soarpack.printable import printable

WIDTH = 100


def _wrapped(label: str, text: str, indent: str = "    ") -> List[str]:
    first = f"{indent}{label}"
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=indent + " " * len(label),
                         break_long_words=False, break_on_hyphens=False) or [first]


def render(diagnosis) -> List[str]:
    """The human report: per input, its known failures (cause, fix, source), or the lines worth reading."""
    from soarpack.diagnose import UNVERIFIED_NOTE

    lines: List[str] = []
    by_path = {}
    for f in diagnosis.findings:
        by_path.setdefault(f.path, []).append(f)
    excerpts = {x.path: x for x in diagnosis.excerpts}
    for inp in diagnosis.inputs:
        path = str(inp.path)
        found, x = by_path.get(path, []), excerpts.get(path)
        if not found and x is None:
            continue
        lines.append(f"{path}  [{inp.kind}]")
        for f in found:
            e = diagnosis.entry(f)
            lines.append(f"  {e.severity.upper()} {e.id}: {e.title}")
            lines.append(f"    {f.where}: {f.quote}" + (f"  ({f.count} matches)" if f.count > 1 else ""))
            shown = {k: v for k, v in f.detail.items() if k not in ("rows",)}
            if shown:
                lines.append("    found: " + ", ".join(f"{k} {json.dumps(v) if not isinstance(v, str) else v}"
                                                      for k, v in shown.items()))
            if e.unverified:
                lines.append(f"    UNVERIFIED: {UNVERIFIED_NOTE.split(': ', 1)[1]}")
            lines += _wrapped("cause: ", e.cause)
            lines += _wrapped("fix:   ", e.fix)
            for s in e.sources:
                lines.append(f"    source: {s.describe()}")
        if x is not None:
            lines.append("  no known failure explains it; the lines worth reading:")
            if x.first_error:
                lines.append(f"    first error: {x.first_error}")
            if x.last_traceback:
                lines.append("    last traceback:")
                lines += [f"      {line}" for line in x.last_traceback]
    n_files = len(diagnosis.inputs)
    if diagnosis.findings:
        ids = sorted({f.entry_id for f in diagnosis.findings})
        lines.append(f"{len(diagnosis.findings)} known failure(s) in {n_files} file(s): {', '.join(ids)}")
    elif diagnosis.excerpts:
        lines.append(f"no known failure in {n_files} file(s); {len(diagnosis.excerpts)} hold errors shown above")
    else:
        lines.append(f"no known failure and no error line in {n_files} file(s)")
    return lines


def _print_catalogue(as_json: bool) -> None:
    from dataclasses import asdict

    from soarpack.diagnose.catalogue import load_catalogue

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
            typer.echo(printable(line))  # log lines and file names are outside text
    raise typer.Exit(diagnosis.exit_code)


__all__ = ["diagnose_cmd", "render"]
