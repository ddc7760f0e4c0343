"""CLI commands of soarpack.quant (registered on the root app)."""

from soarpack.cli import app  # noqa: F401
