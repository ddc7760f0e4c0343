"""How soarpack's help pages read, where Typer's plain (non-rich) pages differ from what a user expects.

- Usage lines name arguments as Click always did (`MODEL_DIR OUT`, `[BUNDLE]`, `[FILES]...`): Typer 0.29 writes a
  required argument in braces (`{MODEL_DIR}`), which reads as shell brace expansion or a placeholder to fill in.
- A list argument is `FILES...` in the Arguments section, not `FILES... <list[Path]>`.
- `soarpack --help` lists each command with its whole first sentence, wrapped to the terminal, instead of cutting
  it at the width left beside the longest command name.
"""

from __future__ import annotations

from typing import Any, List

from typer.core import TyperCommand, TyperGroup

# Longest first sentence the command list shows before it cuts one (they wrap to the terminal's width).
SHORT_HELP_LIMIT = 200


def _is_argument(param: Any) -> bool:
    return param.param_type_name == "argument"  # Typer 0.29 vendors Click: not an instance of click.Argument


def _argument_usage(param: Any) -> str:
    name = param.metavar or (param.name or "").upper()
    if param.nargs != 1:
        name += "..."
    return name if param.required else f"[{name}]" if param.nargs == 1 else f"[{name[:-3]}]..."


def _usage_pieces(command: Any, ctx: Any) -> List[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        pieces.extend([_argument_usage(param)] if _is_argument(param) else param.get_usage_pieces(ctx))
    return pieces


class SoarpackCommand(TyperCommand):
    def collect_usage_pieces(self, ctx: Any) -> List[str]:
        return _usage_pieces(self, ctx)

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments, options = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if _is_argument(param):
                if param.nargs != 1:  # Typer adds the Python type, `<list[Path]>`
                    record = (f"{param.metavar or (param.name or '').upper()}...", record[1])
                arguments.append(record)
            else:
                options.append(record)
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class SoarpackGroup(TyperGroup):
    def collect_usage_pieces(self, ctx: Any) -> List[str]:
        return _usage_pieces(self, ctx) + [self.subcommand_metavar]

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(SHORT_HELP_LIMIT)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
