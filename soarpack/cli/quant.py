"""CLI commands of soarpack.quant: declared with `@command()` (or `subcommand(sub_app)`), logic in soarpack.quant."""

from soarpack.cli import app, command  # noqa: F401
