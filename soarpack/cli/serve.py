"""CLI commands of soarpack.serve: declared with `@command()` (or `subcommand(sub_app)`), logic in soarpack.serve."""

from soarpack.cli import app, command  # noqa: F401
