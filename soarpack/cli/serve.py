"""CLI commands of soarpack.serve (registered on the root app)."""

from soarpack.cli import app  # noqa: F401
