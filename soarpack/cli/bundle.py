"""CLI of soarpack.bundle: `soarpack build` and `soarpack check`. Logic lives in soarpack.bundle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from soarpack.cli import app, command, err_console, subcommand


@command("build")
def build_cmd(
    profile: Optional[str] = typer.Option(None, "--profile", help="Serving profile (name or .toml); default: the default profile."),
    recipe: Optional[str] = typer.Option(None, "--recipe", help="Quantization recipe (name or .toml) instead of the profile's."),
    sglang_src: str = typer.Option("platform", "--sglang-src",
                                   help="'platform': ship the patch set, applied to the image's fork on the platform; "
                                        "or a fork checkout to ship patched."),
    calib: Optional[List[Path]] = typer.Option(None, "--calib", help="Calibration file(s) to ship (repeatable); default: built-in prompts."),
    wheels: bool = typer.Option(True, "--wheels/--no-wheels",
                                help="Bundle the quantization stack as CPython 3.10 wheels (downloaded once into a cache)."),
    wheel_dir: Optional[Path] = typer.Option(None, "--wheel-dir", help="Bundle exactly the wheels of this folder instead."),
    out: Optional[Path] = typer.Option(None, "-o", "--output", help="The tarball to write; default soarpack-PROFILE.tar.gz."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Build the submission .tar.gz: entry scripts, soarpack, profile, calibration, wheels, MANIFEST.json."""
    from soarpack.bundle.build import build_bundle

    log = (lambda msg: err_console.print(msg, highlight=False, soft_wrap=True)) if not as_json else (lambda msg: None)
    result = build_bundle(out, profile=profile, recipe=recipe, sglang_src=sglang_src, calib=calib or (), wheels=wheels,
                          wheel_dir=wheel_dir, log=log)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    if not wheels:
        err_console.print("[bold yellow]NOTE:[/] built with --no-wheels: this bundle cannot quantize on the platform.", highlight=False)
    typer.echo(f"{result.path} ({result.size / 1e6:.1f} MB, {len(result.manifest['files'])} files, "
               f"{len(result.manifest['wheels']['files'])} wheels, profile {result.manifest['profile']['name']})")


_STATUS = {"pass": "[green]pass[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]skip[/]"}  # same visible width


@command("check")
def check_cmd(
    bundle: Path = typer.Argument(..., help="The .tar.gz written by soarpack build."),
    rehearse: bool = typer.Option(True, "--rehearse/--no-rehearse", help="Source prepare_env.sh and quantize a tiny model."),
    sglang_fork: Optional[Path] = typer.Option(None, "--sglang-fork", help="A checkout of the image's SGLang fork, to rehearse patching."),
    keep: Optional[Path] = typer.Option(None, "--keep", help="Rehearse in this folder and keep it (logs, overlay venv)."),
    dev_stack: bool = typer.Option(False, "--dev-stack",
                                   help="Rehearse on this environment's Python instead of the image's stack "
                                        "(CPython 3.10, torch 2.9.1): faster, but no proof for the platform."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Rehearse what the platform does with BUNDLE; every step passes, fails, or is skipped with its reason.

    Exit 0 only when the bundle is uploadable: every rehearsal step passed on the image's stack.
    """
    from soarpack.bundle.check import check_bundle
    from soarpack.imagestack import describe_versions

    def show(step) -> None:
        if not as_json:
            detail = f"  {step.detail}" if step.detail else ""
            ran_on = f"  [dim]({describe_versions(step.versions)})[/]" if step.versions else ""
            err_console.print(f"{_STATUS[step.status]} {escape(step.name):<16} {step.seconds:6.1f} s{escape(detail)}{ran_on}",
                              highlight=False, soft_wrap=True)

    def note(message: str) -> None:
        if not as_json:
            err_console.print(f"[dim]{escape(message)}[/]", highlight=False, soft_wrap=True)

    report = check_bundle(bundle, rehearse=rehearse, sglang_fork=sglang_fork, work_dir=keep, keep=keep is not None,
                          dev_stack=dev_stack, log=show, note=note)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        counts = {k: sum(s.status == k for s in report.steps) for k in ("pass", "fail", "skip")}
        tally = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped on the {report.stack}"
        why = report.not_uploadable_because
        typer.echo(f"uploadable: {tally}" if why is None else f"NOT uploadable ({why}): {tally}")
    if not report.uploadable:
        raise typer.Exit(1)


wheels_app = typer.Typer(help="The platform wheel set (CPython 3.10 manylinux x86_64) that soarpack build bundles.",
                         no_args_is_help=True)
app.add_typer(wheels_app, name="wheels")


@subcommand(wheels_app, "fetch")
def wheels_fetch_cmd() -> None:
    """Download and build the locked wheel set into the local cache (what soarpack build does on a cache miss)."""
    from soarpack.bundle.wheels import default_cache_dir, fetch_into_cache, load_lock

    lock = load_lock()
    cache = default_cache_dir()
    fetch_into_cache(lock, cache, log=lambda m: err_console.print(m, highlight=False))
    typer.echo(f"{len(lock)} wheels in {cache}")


@subcommand(wheels_app, "lock")
def wheels_lock_cmd() -> None:
    """Maintainers: resolve the closure again with pip and rewrite soarpack/bundle/platform-lock.json (network)."""
    from soarpack.bundle.wheels import load_lock, resolve_lock

    path = resolve_lock(log=lambda m: err_console.print(m, highlight=False))
    typer.echo(f"{len(load_lock(path))} wheels locked in {path}")


__all__ = ["app", "build_cmd", "check_cmd", "wheels_fetch_cmd", "wheels_lock_cmd"]
