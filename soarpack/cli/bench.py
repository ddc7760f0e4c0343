"""CLI commands of soarpack.bench (registered on the root app)."""

from soarpack.cli import app  # noqa: F401
