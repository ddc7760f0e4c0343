"""What the sweep tests ask of a command's result: run through the CLI, and one clean error line."""

from __future__ import annotations

from typer.testing import CliRunner

from soarpack.cli import app


def run_cli(*args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def one_error_line(result, *said):
    """Exit 2 with an `error:` line, no traceback, and each of `said` in the output (whitespace folded)."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "error:" in result.output
    flat = " ".join(result.output.split())
    for text in said:
        assert text in flat, (text, result.output)
