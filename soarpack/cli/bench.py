"""CLI commands of soarpack.bench: declared with `@command()` (or `subcommand(sub_app)`), logic in soarpack.bench."""

from soarpack.cli import app, command  # noqa: F401
