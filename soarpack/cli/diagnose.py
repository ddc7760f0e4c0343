"""CLI of soarpack.diagnosis: `soarpack diagnose LOG_OR_DIR...`. Logic lives in soarpack.diagnosis."""

from __future__ import annotations

import inspect
from typing import List

import typer

from soarpack.cli import command, request_values
from soarpack.cli.output import Output
from soarpack.commands.diagnosis import DiagnoseRequest
from soarpack.printable import printable
from soarpack.request import typer_parameters


def render(diagnosis) -> List[str]:
    """The human report (soarpack.diagnosis.report): its lines are already printable."""
    from soarpack.diagnosis.report import render as report_lines

    return report_lines(diagnosis)


def _catalogue() -> Output:
    from dataclasses import asdict

    from soarpack.diagnosis.catalogue import load_catalogue

    entries = load_catalogue()
    lines = []
    for e in entries:
        lines.append(f"{e.id}  [{e.severity}]  {e.title}" + ("  UNVERIFIED" if e.unverified else ""))
        lines += [f"    source: {s.kind} {s.where}" for s in e.sources]
    lines.append(f"{len(entries)} entries, {sum(e.unverified for e in entries)} unverified")
    return Output([{"id": e.id, "title": e.title, "severity": e.severity, "kinds": list(e.kinds),
                    "patterns": [p.pattern for p in e.patterns], "unverified": e.unverified,
                    "sources": [asdict(s) for s in e.sources]} for e in entries], "\n".join(lines))


def diagnose_cmd(**given) -> Output:
    """Name the known failures in a run's logs and results, with their cause and fix.

    LOG_OR_DIR are logs (prepare_env.log, prepare_model.log, quantize.log, a server log), soarpack eval/bench
    JSON, or folders of them (a kept `soarpack check` folder). The failures and their signatures are a catalogue (soarpack/diagnosis/catalogue.toml), each citing where its
    text comes from. A log no known failure explains gets its first error and last traceback. Exit 0: nothing
    found; 1: a known failure; 2: bad input.

    Example:

    \b
      soarpack diagnose logs/ eval.json
      soarpack diagnose --catalogue
    """
    from soarpack import api

    if given.pop("catalogue"):
        return _catalogue()
    diagnosis = api.diagnose(**request_values(DiagnoseRequest, given))
    # log lines and file names are outside text (render escapes them too, the sink once more)
    return Output(diagnosis.to_dict(), "\n".join(printable(line) for line in render(diagnosis)),
                  exit_code=diagnosis.exit_code)


# LOG_OR_DIR is DiagnoseRequest's; --catalogue (the catalogue instead of a diagnosis) is the command's own
diagnose_cmd.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    *typer_parameters(DiagnoseRequest),
    inspect.Parameter("catalogue", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--catalogue", help="List the known failures and the source of each signature instead.")),
], return_annotation=Output)
diagnose_cmd = command("diagnose")(diagnose_cmd)


__all__ = ["diagnose_cmd", "render"]
