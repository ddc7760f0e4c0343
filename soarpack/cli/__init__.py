"""The `soarpack` command: a thin Typer layer. Each area registers its commands from its own module."""

from __future__ import annotations

import functools
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.text import Text

from soarpack.version import __version__
from soarpack.errors import ConfigError, SoarpackError
from soarpack.printable import printable
from soarpack.cli.helpformat import SoarpackCommand, SoarpackGroup
from soarpack.cli.output import Format as OutputFormat


class UsageError(ConfigError):
    """A flag given wrongly on the command line."""

# Plain help pages (no rich panels): no `<bool>` after flags, and help text is never read as markup. They use the
# terminal's width up to 120 columns (wider lines are hard to read); soarpack.cli.helpformat says what else differs.
HELP_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 120}
app = typer.Typer(
    name="soarpack",
    help="Quantize MiniCPM-SALA, package a SOAR submission, and measure it before you upload.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (README: Shell completion)
    cls=SoarpackGroup,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=HELP_SETTINGS,
)
err_console = Console(stderr=True)


def sub_app(help_text: str) -> typer.Typer:
    """A command group (`soarpack sglang ...`) with the same help style as the top level."""
    return typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None, context_settings=HELP_SETTINGS,
                       cls=SoarpackGroup)


def renamed(value, old_value, flag: str, old_flag: str):
    """The value of an option given under its name or its old, hidden spelling (kept for one release)."""
    if old_value is None:
        return value
    if value is not None and value != old_value:
        raise UsageError(f"{flag} and {old_flag} are one option given twice", f"pass only {flag}")
    err_console.print(f"note: {old_flag} is now {flag}; the old name goes in the next release", highlight=False)
    return old_value


def request_values(model, given: dict) -> dict:
    """A command's parsed options as its typed request's values: old hidden flags merged into their new ones (with
    the note `renamed` prints), choices as their strings."""
    from soarpack.request import cli_values, old_flag_values

    olds = old_flag_values(model, given)
    values = cli_values(model, given)
    for name, flag, old_flag, old_value in olds:
        values[name] = renamed(values[name], old_value, flag, old_flag)
    return values


def required(value, flag: str):
    """Refuse a missing option that is required but has a hidden alias (so Typer cannot require it itself)."""
    if value is None:
        raise UsageError(f"missing option {flag}", "see --help")
    return value


def _version(value: bool) -> None:
    if value:
        typer.echo(f"soarpack {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Optional[bool] = typer.Option(None, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    fmt: Optional[OutputFormat] = typer.Option(None, "--format", metavar="text|json", case_sensitive=False,
                                               help="How a command prints its result: text (default) or json "
                                                    "(each command's --json is the same)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only problems and the result."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Every line the libraries emit."),
) -> None:
    """Quantize MiniCPM-SALA, package a SOAR submission, and measure it before you upload."""
    from soarpack.cli.output import reset

    try:
        reset(fmt.value if fmt else None, quiet=quiet, verbose=verbose)
    except SoarpackError as exc:
        raise fail(exc) from None


def fail(exc: SoarpackError) -> "typer.Exit":
    """Print a SoarpackError as one cause line plus a hint; return the Exit to raise. A verdict under --format json
    prints nothing: the document holds it."""
    from soarpack.cli.output import STATE, Format, Verdict

    if isinstance(exc, Verdict) and STATE.format == Format.json.value:
        return typer.Exit(exc.exit_code)
    # Messages quote user text (paths, keys, `[table]` names): Text keeps their brackets out of rich's markup.
    # soft_wrap: one logical line stays one line (a path is never broken), the terminal wraps it if it must.
    # printable: a quoted file name or server reply cannot send the terminal an escape sequence.
    err_console.print(Text.assemble(("error:", "bold red"), " ", printable(exc.message)), highlight=False, soft_wrap=True)
    if exc.hint:
        err_console.print(Text.assemble(("hint:", "yellow"), " ", printable(exc.hint)), highlight=False, soft_wrap=True)
    return typer.Exit(exc.exit_code)


def handle_errors(fn):
    """Decorate a command: the Output it returns is rendered by the sink, a SoarpackError becomes a clear message and
    its exit code (2 for bad input; also under CliRunner)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from soarpack.cli.output import Output, show

        try:
            returned = fn(*args, **kwargs)
            if isinstance(returned, Output):
                show(returned)
        except SoarpackError as exc:
            raise fail(exc) from None

    return wrapper


def command(*args, **kwargs):
    """`@app.command()` with SoarpackError handling: the one way commands are declared."""
    return _command_on(app, *args, **kwargs)


JSON_ALIAS = "json_alias"


def _with_json_alias(fn):
    """`fn` with the deprecated per-command `--json` (the same as `soarpack --format json CMD`), declared here once."""
    import inspect

    from soarpack.cli.output import STATE, Format

    option = typer.Option(False, "--json", help="The same as soarpack --format json (kept for scripts).")
    params = list(inspect.signature(fn).parameters.values())
    params.append(inspect.Parameter(JSON_ALIAS, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=bool))

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if kwargs.pop(JSON_ALIAS, False):
            STATE.format = Format.json.value
        return fn(*args, **kwargs)

    wrapper.__signature__ = inspect.signature(fn).replace(parameters=params)
    return wrapper


def _command_on(typer_app: typer.Typer, *args, **kwargs):
    def deco(fn):
        return typer_app.command(*args, cls=SoarpackCommand, **kwargs)(handle_errors(_with_json_alias(fn)))

    return deco


def subcommand(typer_app: typer.Typer, *args, **kwargs):
    """The same as `command`, for a sub-app (`soarpack sglang apply`)."""
    return _command_on(typer_app, *args, **kwargs)


def _register_all() -> None:
    # Each module adds its commands to `app`; imports stay inside the commands so `--help` is fast.
    from soarpack.cli import bench, bundle, cache, diagnose, env, fakeserver, kernels, quant, sala, serve  # noqa: F401

    # `soarpack --help` lists the commands in the order a user meets them (groups follow: sglang, wheels).
    rank = {name: i for i, name in enumerate(WORKFLOW)}
    app.registered_commands.sort(key=lambda info: rank.get(info.name, len(rank)))


WORKFLOW = ("tiny-model", "calib", "quantize", "verify", "serve-check", "recipes", "profiles", "args", "build", "inspect", "check",
            "eval", "bench", "speedset", "score", "compare", "rehearse-server", "diagnose", "fake-server", "env")


_register_all()


def main(argv: Optional[list] = None) -> None:
    try:
        app(args=argv, standalone_mode=True)
    except SoarpackError as exc:  # raised outside a command (option callbacks)
        raise SystemExit(fail(exc).exit_code) from None
