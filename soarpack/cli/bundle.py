"""CLI commands of soarpack.bundle: declared with `@command()` (or `subcommand(sub_app)`), logic in soarpack.bundle."""

from soarpack.cli import app, command  # noqa: F401
