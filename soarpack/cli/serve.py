"""CLI of soarpack.serve: `soarpack sglang apply|check|list`, `soarpack args PROFILE`, `soarpack profiles`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from soarpack.cli import app, command, err_console, renamed, required, sub_app, subcommand
from soarpack.printable import printable
from soarpack.cli.output import Output, sink
from soarpack.facts import launch
from soarpack.recipe.profile import DEFAULT_PROFILE

sglang_app = sub_app("Our patch set for the OpenBMB minicpm_sala SGLang fork: check a tree, apply it.")
app.add_typer(sglang_app, name="sglang")

_SRC_HELP = "The SGLang fork's python/ folder (the one holding sglang/), or its repository root."
_PATCH_HELP = "Only this patch (repeatable); default: all, in order."


def _draw_tree_report(report, console) -> None:
    from rich.table import Table

    shown = lambda text: escape(printable(text))  # noqa: E731 - paths and messages name the tree's own files
    where = f"fork commit {report.commit} ({report.state})" if report.commit else "no known fork commit"
    console.print(f"[bold]{shown(report.src)}[/]: touched files match {shown(where)}", highlight=False)
    for path in report.differing:
        console.print(f"  differs from every recorded commit: {shown(path)}", highlight=False)
    table = Table("patch", "status", "files")
    label = {"apply": "[green]applies[/]", "applied": "[cyan]already applied[/]", "fail": "[red]fails[/]"}
    for p in report.patches:
        files = "\n".join(f"{shown(f.path.rsplit('/', 1)[-1])}: {f.status}" for f in p.files)
        table.add_row(shown(p.name), label[p.status], files)
    console.print(table)
    for p in report.patches:
        for msg in p.problems():
            console.print(f"[red]{shown(p.name)}[/]: {escape(printable(msg, keep=chr(10)))}", highlight=False)
    if report.written:
        console.print("written: " + ", ".join(shown(w) for w in report.written), highlight=False)


@subcommand(sglang_app, "check")
def sglang_check(
    src: Optional[Path] = typer.Option(None, "--sglang-src", metavar="DIR", help=_SRC_HELP + " [required]"),
    patch: Optional[List[str]] = typer.Option(None, "--patch", metavar="NAME", help=_PATCH_HELP),
    old_src: Optional[Path] = typer.Option(None, "--src", hidden=True),
) -> Output:
    """Which patches apply, are already applied or fail on a tree, and which fork commit it matches.

    Example:

    \b
      soarpack sglang check --sglang-src ~/sglang/python
    """
    from soarpack.serve.patches import PatchError, check_tree

    src = required(renamed(src, old_src, "--sglang-src", "--src"), "--sglang-src")

    report = check_tree(src, patch or None, log=sink().note)
    failing = PatchError(f"{sum(p.status == 'fail' for p in report.patches)} patch(es) do not apply to {report.src}",
                         "see the lines above: the file and line where each hunk stopped matching")
    return Output(report.to_dict(), lambda console: _draw_tree_report(report, console),
                  None if report.ok else failing)


@subcommand(sglang_app, "apply")
def sglang_apply(
    src: Optional[Path] = typer.Option(None, "--sglang-src", metavar="DIR", help=_SRC_HELP + " [required]"),
    out: Optional[Path] = typer.Option(None, "-o", "--output", metavar="DIR",
                                       help="Where the patched copy goes (the same as --sglang-src patches in "
                                            "place). [required]"),
    patch: Optional[List[str]] = typer.Option(None, "--patch", metavar="NAME", help=_PATCH_HELP),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty --output."),
    old_src: Optional[Path] = typer.Option(None, "--src", hidden=True),
    old_out: Optional[Path] = typer.Option(None, "--out", hidden=True),
) -> Output:
    """Copy the tree to --output with our patches applied; all or nothing.

    Example:

    \b
      soarpack sglang apply --sglang-src ~/sglang/python -o patched/python
    """
    from soarpack.serve.patches import apply_patches

    src = required(renamed(src, old_src, "--sglang-src", "--src"), "--sglang-src")
    out = required(renamed(out, old_out, "--output", "--out"), "--output")

    report = apply_patches(src, out, patch or None, force=force, log=sink().note)

    def draw(console) -> None:
        _draw_tree_report(report, console)
        console.print(f"patched tree: {printable(out)}", markup=False, highlight=False)

    return Output(report.to_dict(), draw)


@subcommand(sglang_app, "list")
def sglang_list() -> Output:
    """The patches, in apply order, with what each changes.

    Example:

    \b
      soarpack sglang list
    """
    from soarpack.serve.patches import load_patches, patch_dir

    patches = load_patches()
    data = [{"name": p.name, "file": str(p.path), "concern": p.summary, "files": [f.path for f in p.files]}
            for p in patches]
    return Output(data, "\n".join([f"patch set: {patch_dir()}", *(f"{p.name:28s} {p.summary}" for p in patches)]))


def _launch_example() -> str:
    """The platform's launch line for the `args` help, wrapped (soarpack.facts.launch)."""
    lead = " ".join(["python -m", launch.MODULE, *launch.leading_args("Q")[:3]])
    middle = " ".join([*launch.leading_args("Q")[3:], "$SGLANG_SERVER_ARGS", *launch.TRAILING_ARGS[:2]])
    return f"{lead} \\\n        {middle} \\\n        {' '.join(launch.TRAILING_ARGS[2:])}"


_ARGS_HELP = f"""Print SGLANG_SERVER_ARGS for a serving profile, after linting it (errors exit 2).

    Example, as the platform starts its server (start yours the same way):

    \b
      export SGLANG_SERVER_ARGS="$(soarpack args safe)"
      {_launch_example()}
    """


@command("args", help=_ARGS_HELP)
def args_cmd(
    profile: str = typer.Argument(DEFAULT_PROFILE, metavar="PROFILE",
                                  help="Serving profile name (soarpack profiles) or a .toml path."),
    src: Optional[Path] = typer.Option(None, "--sglang-src", metavar="DIR",
                                       help="Lint the flags against this fork tree's server_args.py."),
    unpatched: bool = typer.Option(False, "--unpatched", help="Lint as if none of the profile's patches were applied."),
    old_src: Optional[Path] = typer.Option(None, "--src", hidden=True),
) -> Output:
    """_ARGS_HELP above (the launch line comes from soarpack.facts.launch)."""
    from rich.markup import escape

    from soarpack.serve.lint import lint_args, raise_on_errors
    from soarpack.serve.patches import resolve_src
    from soarpack.recipe.profile import load_profile

    src = renamed(src, old_src, "--sglang-src", "--src")
    prof = load_profile(profile)
    tree = resolve_src(src) if src else None
    findings = lint_args(prof.args, recipe=prof.recipe, patched=set() if unpatched else set(prof.patches), server_args_py=tree)
    if not sink().json:  # problems, on stderr (the document lists them)
        for f in findings:
            color = "red" if f.level == "error" else "yellow"
            err_console.print(f"[{color}]{f.level}[/] {escape(f.rule)}: {escape(f.message)}", highlight=False)
    raise_on_errors(findings, f"profile {prof.name}")
    return Output({**prof.to_dict(), "findings": [f.to_dict() for f in findings]}, prof.args_string())


@command("profiles")
def profiles_cmd() -> Output:
    """The serving profiles: recipe, patches, fallback, what each is for, and what is known about it.

    Each evidence line gives what peers measured on the platform, what soarpack measured, or that nothing
    was, with its source (docs/evidence.md).

    Example:

    \b
      soarpack profiles
    """
    from soarpack.recipe.profile import list_profiles, load_profile

    profs = [load_profile(n) for n in list_profiles()]
    lines = []
    for p in profs:
        mark = " (default)" if p.name == DEFAULT_PROFILE else ""
        lines += [f"{p.name}{mark}: recipe {p.recipe}, patches [{', '.join(p.patches)}], fallback {p.fallback or '-'}",
                  f"    {p.description}", *(f"    evidence {e.line()}" for e in p.evidence)]
        if not p.evidence:
            lines.append("    evidence: none recorded")
    return Output([p.to_dict() for p in profs], "\n".join(lines))


@command("serve-check")
def serve_check_cmd(
    ckpt: Path = typer.Argument(..., metavar="CKPT", help="A quantized checkpoint (written by soarpack quantize)."),
    sglang_src: Path = typer.Option(..., "--sglang-src", metavar="DIR", help=_SRC_HELP),
    recipe: Optional[str] = typer.Option(None, "--recipe", metavar="NAME|FILE",
                                         help="Judge against this recipe; default: the one the checkpoint names."),
    profile: Optional[str] = typer.Option(None, "--profile", metavar="NAME|FILE",
                                          help="Serving profile whose SGLANG_SERVER_ARGS the fork parses; default: "
                                               "the default profile."),
    python: Optional[Path] = typer.Option(None, "--python", metavar="PYTHON",
                                          help="The child's interpreter (torch and the fork's deps); default: the "
                                               "image stand-in."),
    dev_stack: bool = typer.Option(False, "--dev-stack", help="Run the child on this interpreter instead of the image stand-in."),
) -> Output:
    """Load a checkpoint through the SGLang fork's own code on a CPU.

    Shows the quant method per linear, leftover tensors and unwritten parameters. Exit 0 pass, 1 fail, 2 bad input.

    Example:

    \b
      soarpack serve-check Q --sglang-src ~/sglang/python
    """
    from soarpack.serve.forkcheck import run_fork_check
    from soarpack.recipe.profile import load_profile

    server_args = load_profile(profile).args if profile else None
    result = run_fork_check(ckpt, sglang_src, recipe, python, dev_stack=dev_stack, server_args=server_args,
                            on_event=sink().event)
    if not result.ok and not sink().json:  # the document lists them
        for problem in result.problems:
            err_console.print(f"[bold red]error:[/] {escape(printable(problem))}", highlight=False, soft_wrap=True)
    return Output(result.to_dict(), f"{result.table}\n{result.summary}", exit_code=0 if result.ok else 1)


@command("rehearse-server")
def rehearse_server_cmd(
    ckpt: Path = typer.Argument(..., metavar="CKPT", help="The quantized checkpoint to serve (what prepare_model.sh wrote)."),
    data: Path = typer.Option(..., "--data", metavar="FILE", help="Your copy of the public set (perf_public_set.jsonl)."),
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", metavar="NAME|FILE",
                                help="Serving profile whose SGLANG_SERVER_ARGS the server gets."),
    out: Optional[Path] = typer.Option(None, "-o", "--output", metavar="DIR",
                                       help="Folder for server.log, eval.json, bench.json, score.json "
                                            "(default: rehearsal)."),
    port: int = typer.Option(launch.PORT, "--port", metavar="PORT", help=f"The server's port (the platform's is {launch.PORT})."),
    per_task: int = typer.Option(6, "--per-task", metavar="N", min=1, help="Eval rows per task (a stratified slice)."),
    bench_rows: int = typer.Option(8, "--bench-rows", metavar="N", min=1, help="Rows of the short bench (each tier)."),
    ready_timeout: float = typer.Option(600.0, "--ready-timeout", metavar="SECONDS", help="How long to wait for /health."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", metavar="N", min=1,
                                             help="Cap every answer (eval and bench) at N tokens, to rehearse the "
                                                  "steps quickly, e.g. on random weights; the accuracy is then not "
                                                  "the platform's. Default: the platform's limits."),
    python: Optional[str] = typer.Option(None, "--python", metavar="PYTHON",
                                         help="The Python with the fork installed; default: this one."),
    old_out: Optional[Path] = typer.Option(None, "--out", hidden=True),
) -> Output:
    """On a GPU box with the fork installed: serve CKPT as the platform does, eval a slice, bench, score.

    Reports the accuracy gate C with its margin. Exit 1 when C < 1 or a request failed.

    Example:

    \b
      soarpack rehearse-server Q --data perf_public_set.jsonl --profile safe
    """
    import sys

    out = renamed(out, old_out, "--output", "--out") or Path("rehearsal")

    from soarpack.rehearse.server import rehearse_server

    sink_ = sink()
    result = rehearse_server(ckpt, profile, data, out, port=port, python=python or sys.executable, per_task=per_task,
                             bench_rows=bench_rows, ready_timeout_s=ready_timeout, max_tokens=max_tokens,
                             on_event=sink_.event)
    return Output(result.to_dict(), result.gate or result.summary, exit_code=0 if result.ok else 1)
