"""CLI commands of soarpack.sala (registered on the root app)."""

from soarpack.cli import app  # noqa: F401
