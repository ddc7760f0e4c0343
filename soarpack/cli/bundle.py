"""CLI commands of soarpack.bundle (registered on the root app)."""

from soarpack.cli import app  # noqa: F401
