"""CLI of soarpack.bundle: `soarpack build`, `inspect`, `check`, `wheels`. Logic lives in soarpack.bundle."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import List, Optional

import typer

from soarpack.cli import app, command, err_console, request_values, sub_app, subcommand
from soarpack.cli.output import Output, sink
from soarpack.commands.bundle import BUNDLE_HELP as _BUNDLE_ARG_HELP, BuildRequest, CheckRequest
from soarpack.printable import printable
from soarpack.request import typer_parameters


def _bundle_or_newest(bundle: Optional[Path]) -> Path:
    from soarpack.bundle.build import newest_bundle

    if bundle is not None:
        return bundle
    found = newest_bundle()
    err_console.print(f"bundle: {printable(found)}", markup=False, highlight=False)
    return found


def build_cmd(**given) -> Output:
    """Build the submission .tar.gz: entry scripts, soarpack, profile, calibration, wheels, MANIFEST.json.

    Prints the tarball's path on stdout.

    Example:

    \b
      soarpack build --profile safe --calib my.jsonl
    """
    from soarpack import api

    out_ = sink()
    values = request_values(BuildRequest, given)
    result = api.build(**values, on_event=out_.event)
    if not values["wheels"]:
        out_.problem("built with --no-wheels: this bundle cannot quantize on the platform.", prefix="NOTE")
    if not result.risks:
        out_.say(_risk_lines([])[0])  # the risk lines themselves came with the build's events
    if result.placed == "up-to-date":
        out_.say(f"{result.path} is up to date: these very bytes were already there")
    out_.say(f"{result.size / 1e6:.1f} MB, {len(result.manifest['files'])} files, "
             f"{len(result.manifest['wheels']['files'])} wheels, profile {result.manifest['profile']['name']}")
    return Output(result.to_dict(), str(result.path))


build_cmd.__signature__ = inspect.Signature(typer_parameters(BuildRequest), return_annotation=Output)  # type: ignore
build_cmd = command("build")(build_cmd)


@command("inspect")
def inspect_cmd(
    bundle: Optional[Path] = typer.Argument(None, metavar="BUNDLE", help=_BUNDLE_ARG_HELP, show_default=False),
    steps: bool = typer.Option(False, "--steps", help="What the platform will run, step by step: each command, "
                                                     "the variables prepare_env.sh exports, the server's launch line, "
                                                     "where each log goes."),
) -> Output:
    """What a bundle holds, from its MANIFEST.json (nothing is extracted).

    Identity (the id the default name carries and eval/bench record), profile, recipe, calibration rows and
    sources, server args, wheels, sha256.

    Example:

    \b
      soarpack inspect
      soarpack inspect --steps
    """
    if steps:
        from soarpack.bundle.steps_view import platform_steps, render_steps

        view = platform_steps(_bundle_or_newest(bundle))
        return Output(view, "\n".join(render_steps(view)))
    from soarpack.bundle.risks import Risk
    from soarpack.bundle.summary import inspect_bundle
    from soarpack.evidence import Evidence

    summary = inspect_bundle(_bundle_or_newest(bundle))
    q = {k: v for k, v in summary["quantize"].items()
         if k not in ("recipe", "recipe_name", "calibration") and v not in ([], None, {})}
    lines = [
        ("bundle", f"{summary['path']} ({summary['size'] / 1e6:.1f} MB, {summary['files']} files)"),
        ("id", summary["id"]),
        ("sha256", summary["sha256"]),
        ("soarpack", summary["soarpack_version"]),
        ("profile", f"{summary['profile']} (fallback {summary['fallback'] or '-'}, "
                    f"patches {', '.join(summary['patches']) or 'none'})"),
        ("server args", summary["server_args"]),
        ("recipe", summary["recipe"] + (f"  {json.dumps(q)}" if q else "")),
        ("calibration", f"{summary['calibration']['rows']} rows from "
                        + ", ".join(f"{s['file']} ({s['rows']})" for s in summary["calibration"]["sources"])),
        ("sglang", summary["sglang"]["mode"] + (f" (fork {summary['sglang']['fork_commit']})"
                                                 if summary["sglang"]["fork_commit"] else "")),
        ("wheels", f"{summary['wheels']['count']} ({summary['wheels']['source']})"),
    ]
    asked = summary["quantize"].get("calibration") or {}
    if "rows_asked" in asked:
        i = [key for key, _ in lines].index("calibration")
        from soarpack.bundle.build import ASKED_BY_WORDS

        by = ASKED_BY_WORDS.get(asked["asked_by"], asked["asked_by"])
        lines[i] = (lines[i][0], lines[i][1] + f", of the {asked['rows_asked']} asked ({by})"
                    + ("; the built-in synthetic prompts" if asked.get("builtin") else ""))
    for what in ("recipe", "profile"):
        for entry in summary["evidence"].get(what) or []:
            lines.append(("evidence", f"{what}: {Evidence.model_validate(entry).line()}"))
    text = [f"{key:<12} {printable(value)}" for key, value in lines]
    return Output(summary, "\n".join(text + _risk_lines([Risk(**r) for r in summary["risks"]])))


def _risk_lines(risks) -> List[str]:
    """One line per risk, with its evidence (build, check and inspect print them alike)."""
    lines = [printable(risk.line()) for risk in risks]  # a risk quotes file names from the bundle
    return lines or ["risks: none known (the recipe's and profile's evidence: soarpack recipes, soarpack profiles)"]


def check_cmd(**given) -> Output:
    """Rehearse what the platform does with BUNDLE; every step passes, fails, or is skipped with its reason.

    Then the risks to the score, one line each with its evidence, and the verdict: uploadable, uploadable
    with N risks, or NOT uploadable. Exit 0 only when the bundle is uploadable: every rehearsal step passed on
    the image's stack, and no recipe or profile of it was measured at or below the full-credit line (C < 1) unless
    --accept-risk names that risk. A failed rehearsal keeps its logs and prints the `soarpack diagnose DIR`
    that reads them.

    Example:

    \b
      soarpack check soarpack-safe-w4-mlp-1a2b3c4d.tar.gz
    """
    from soarpack import api
    from soarpack.rehearse.check import diagnose_command, verdict

    values = request_values(CheckRequest, given)
    out = sink()
    report = api.check(**{**values, "bundle": _bundle_or_newest(values["bundle"])}, on_event=out.event)
    if report.logs_dir:
        out.problem(f"the rehearsal's logs are kept in {report.logs_dir}; read them with: "
                    f"{diagnose_command(report.logs_dir)}", prefix="logs")
    text = "\n".join([*_risk_lines(report.risks), printable(verdict(report))])
    return Output(report.to_dict(), text, exit_code=0 if report.uploadable else 1)


check_cmd.__signature__ = inspect.Signature(typer_parameters(CheckRequest), return_annotation=Output)  # type: ignore
check_cmd = command("check")(check_cmd)


wheels_app = sub_app("The platform wheel set (CPython 3.10 manylinux x86_64) that soarpack build bundles.")
app.add_typer(wheels_app, name="wheels")


@subcommand(wheels_app, "fetch")
def wheels_fetch_cmd() -> Output:
    """Download and build the locked wheel set into the local cache (what build does on a cache miss).

    Example:

    \b
      SOARPACK_CACHE=/tmp/c soarpack wheels fetch
    """
    from soarpack.bundle.wheels import default_cache_dir, fetch_into_cache, load_lock

    out = sink()
    lock = load_lock()
    cache = default_cache_dir()
    fetch_into_cache(lock, cache, on_event=out.event)
    return Output({"cache": str(cache), "wheels": [w.spec for w in lock]}, f"{len(lock)} wheels in {cache}")


@subcommand(wheels_app, "lock")
def wheels_lock_cmd() -> Output:
    """Maintainers: resolve the closure again with pip and rewrite soarpack/bundle/platform-lock.json (network).

    Example:

    \b
      soarpack wheels lock
    """
    from soarpack.bundle.wheels import load_lock, resolve_lock

    out = sink()
    path = resolve_lock(on_event=out.event)
    lock = load_lock(path)
    return Output({"lock": str(path), "wheels": [w.spec for w in lock]}, f"{len(lock)} wheels locked in {path}")


__all__ = ["app", "build_cmd", "check_cmd", "inspect_cmd", "wheels_fetch_cmd", "wheels_lock_cmd"]
