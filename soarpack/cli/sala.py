"""CLI commands of soarpack.sala: declared with `@command()` (or `subcommand(sub_app)`), logic in soarpack.sala."""

from soarpack.cli import app, command  # noqa: F401
