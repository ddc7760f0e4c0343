"""CLI of soarpack.bundle: `soarpack build`, `inspect`, `check`, `wheels`. Logic lives in soarpack.bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from soarpack.cli import app, command, err_console, renamed, sub_app, subcommand
from soarpack.facts import image

_BUNDLE_ARG_HELP = "The .tar.gz written by soarpack build; default: the newest soarpack-*.tar.gz here."


def _bundle_or_newest(bundle: Optional[Path]) -> Path:
    from soarpack.bundle.build import newest_bundle

    if bundle is not None:
        return bundle
    found = newest_bundle()
    err_console.print(f"bundle: {found}", markup=False, highlight=False)
    return found


@command("build")
def build_cmd(
    profile: Optional[str] = typer.Option(None, "--profile", metavar="NAME|FILE",
                                          help="Serving profile (soarpack profiles); default: the default profile."),
    recipe: Optional[str] = typer.Option(None, "--recipe", metavar="NAME|FILE",
                                         help="Quantization recipe instead of the profile's."),
    sglang_src: Optional[str] = typer.Option(None, "--sglang-src", metavar="DIR",
                                             help="Ship this fork checkout, patched. Default: ship the patch set, "
                                                  "applied to the image's fork on the platform."),
    calib: Optional[List[Path]] = typer.Option(None, "--calib", metavar="FILE",
                                               help="Calibration file to ship (repeatable); default: built-in "
                                                    "prompts. Formats: soarpack calib --help."),
    wheels: bool = typer.Option(True, "--wheels/--no-wheels",
                                help="Bundle the quantization stack as CPython 3.10 wheels (cached once)."),
    wheel_dir: Optional[Path] = typer.Option(None, "--wheel-dir", metavar="DIR",
                                             help="Bundle exactly the wheels of this folder instead."),
    out: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE",
                                       help="The tarball to write; default: soarpack-PROFILE-RECIPE-HASH.tar.gz, "
                                            "HASH from the content (one name, one submission)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Build the submission .tar.gz: entry scripts, soarpack, profile, calibration, wheels, MANIFEST.json.

    Prints the tarball's path on stdout.

    Example:

    \b
      soarpack build --profile safe --calib my.jsonl
    """
    from soarpack.bundle.build import PLATFORM, build_bundle

    log = (lambda msg: err_console.print(msg, markup=False, highlight=False, soft_wrap=True)) if not as_json else (lambda msg: None)
    result = build_bundle(out, profile=profile, recipe=recipe, sglang_src=sglang_src or PLATFORM, calib=calib or (),
                          wheels=wheels, wheel_dir=wheel_dir, force=force, log=log)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    if not wheels:
        err_console.print("[bold yellow]NOTE:[/] built with --no-wheels: this bundle cannot quantize on the platform.", highlight=False)
    err_console.print(f"{result.size / 1e6:.1f} MB, {len(result.manifest['files'])} files, "
                      f"{len(result.manifest['wheels']['files'])} wheels, profile {result.manifest['profile']['name']}",
                      markup=False, highlight=False)
    typer.echo(str(result.path))


@command("inspect")
def inspect_cmd(
    bundle: Optional[Path] = typer.Argument(None, metavar="BUNDLE", help=_BUNDLE_ARG_HELP, show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """What a bundle holds, from its MANIFEST.json (nothing is extracted).

    Identity (the id the default name carries and eval/bench record), profile, recipe, calibration rows and
    sources, server args, wheels, sha256.

    Example:

    \b
      soarpack inspect
    """
    from soarpack.bundle.summary import inspect_bundle

    summary = inspect_bundle(_bundle_or_newest(bundle))
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    q = {k: v for k, v in summary["quantize"].items() if k not in ("recipe", "recipe_name") and v not in ([], None, {})}
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
    for key, value in lines:
        typer.echo(f"{key:<12} {value}")


_STATUS = {"pass": "[green]pass[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]skip[/]"}  # same visible width


@command("check")
def check_cmd(
    bundle: Optional[Path] = typer.Argument(None, metavar="BUNDLE", help=_BUNDLE_ARG_HELP, show_default=False),
    rehearse: bool = typer.Option(True, "--rehearse/--no-rehearse", help="Source prepare_env.sh and quantize a tiny model."),
    sglang_src: Optional[Path] = typer.Option(None, "--sglang-src", metavar="DIR",
                                              help="A checkout of the image's SGLang fork, to rehearse patching."),
    keep: Optional[Path] = typer.Option(None, "--keep", metavar="DIR",
                                        help="Rehearse in this folder and keep it (logs, overlay venv)."),
    dev_stack: bool = typer.Option(False, "--dev-stack",
                                   help="Rehearse on this environment's Python instead of the image's stack "
                                        f"({image.describe_short()}): faster, but no proof for the platform."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    old_sglang_fork: Optional[Path] = typer.Option(None, "--sglang-fork", hidden=True),
) -> None:
    """Rehearse what the platform does with BUNDLE; every step passes, fails, or is skipped with its reason.

    Exit 0 only when the bundle is uploadable: every rehearsal step passed on the image's stack.

    Example:

    \b
      soarpack check soarpack-safe-w4-mlp-1a2b3c4d.tar.gz
    """
    from soarpack.bundle.check import check_bundle
    from soarpack.imagestack import describe_versions

    sglang_src = renamed(sglang_src, old_sglang_fork, "--sglang-src", "--sglang-fork")
    bundle = _bundle_or_newest(bundle)
    status_line = None

    def started(name: str) -> None:
        nonlocal status_line
        if not as_json and err_console.is_terminal:
            status_line = err_console.status(f"running: {escape(name)} ...")
            status_line.start()
        elif not as_json:
            err_console.print(f"running: {name} ...", markup=False, highlight=False)

    def show(step) -> None:
        nonlocal status_line
        if status_line is not None:
            status_line.stop()
            status_line = None
        if not as_json:
            detail = f"  {step.detail}" if step.detail else ""
            ran_on = f"  [dim]({describe_versions(step.versions)})[/]" if step.versions else ""
            err_console.print(f"{_STATUS[step.status]} {escape(step.name):<16} {step.seconds:6.1f} s{escape(detail)}{ran_on}",
                              highlight=False, soft_wrap=True)

    def note(message: str) -> None:
        if not as_json:
            err_console.print(f"[dim]{escape(message)}[/]", highlight=False, soft_wrap=True)

    report = check_bundle(bundle, rehearse=rehearse, sglang_fork=sglang_src, work_dir=keep, keep=keep is not None,
                          dev_stack=dev_stack, log=show, note=note, started=started)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        counts = {k: sum(s.status == k for s in report.steps) for k in ("pass", "fail", "skip")}
        tally = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped on the {report.stack}"
        why = report.not_uploadable_because
        typer.echo(f"uploadable: {tally}" if why is None else f"NOT uploadable ({why}): {tally}")
    if not report.uploadable:
        raise typer.Exit(1)


wheels_app = sub_app("The platform wheel set (CPython 3.10 manylinux x86_64) that soarpack build bundles.")
app.add_typer(wheels_app, name="wheels")


@subcommand(wheels_app, "fetch")
def wheels_fetch_cmd(as_json: bool = typer.Option(False, "--json", help="Print the cache and wheels as JSON.")) -> None:
    """Download and build the locked wheel set into the local cache (what build does on a cache miss).

    Example:

    \b
      SOARPACK_CACHE=/tmp/c soarpack wheels fetch
    """
    from soarpack.bundle.wheels import default_cache_dir, fetch_into_cache, load_lock

    lock = load_lock()
    cache = default_cache_dir()
    fetch_into_cache(lock, cache, log=lambda m: err_console.print(m, markup=False, highlight=False))
    if as_json:
        typer.echo(json.dumps({"cache": str(cache), "wheels": [w.spec for w in lock]}, indent=2))
    else:
        typer.echo(f"{len(lock)} wheels in {cache}")


@subcommand(wheels_app, "lock")
def wheels_lock_cmd() -> None:
    """Maintainers: resolve the closure again with pip and rewrite soarpack/bundle/platform-lock.json (network).

    Example:

    \b
      soarpack wheels lock
    """
    from soarpack.bundle.wheels import load_lock, resolve_lock

    path = resolve_lock(log=lambda m: err_console.print(m, markup=False, highlight=False))
    typer.echo(f"{len(load_lock(path))} wheels locked in {path}")


__all__ = ["app", "build_cmd", "check_cmd", "inspect_cmd", "wheels_fetch_cmd", "wheels_lock_cmd"]
