"""Issue 27 item 4, swept over the commands: a path argument that does not exist (or is a directory where a
file is wanted) is bad input, one `error:` line with the fix and exit 2, never a verdict or a problem list
(exit 1). `check` and `verify --original` answered with a verdict before."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app

runner = CliRunner()


def _one_error(res, *said: str) -> None:
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "uploadable" not in res.output and "problem(s)" not in res.output, res.output
    assert "hint: " in res.output and "Traceback" not in res.output
    for text in said:
        assert text in res.output, (text, res.output)


@pytest.mark.needs_torch
def test_verify_original_that_does_not_exist_is_bad_input(tmp_path):
    from soarpack.sala.tiny import make_tiny_model

    ckpt = make_tiny_model(tmp_path / "ckpt", num_layers=1)  # any directory with a config: the check comes first
    res = runner.invoke(app, ["verify", str(ckpt), "--original", str(tmp_path / "nosuch")])
    _one_error(res, f"--original {tmp_path / 'nosuch'} does not exist")
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    _one_error(runner.invoke(app, ["verify", str(ckpt), "--original", str(afile)]), "is not a directory")


@pytest.mark.parametrize("args, said", [
    (["check", "{tmp}/nosuch.tar.gz"], "does not exist"),
    (["check", "{tmp}"], "is a directory"),
    (["inspect", "{tmp}/nosuch.tar.gz"], "does not exist"),
    (["inspect", "--steps", "{tmp}/nosuch.tar.gz"], "does not exist"),
    (["diagnose", "{tmp}/nosuch.log"], "does not exist"),
    pytest.param(["verify", "{tmp}/nosuch"], "is not a directory", marks=pytest.mark.needs_torch),
    (["compare", "{tmp}/nosuch.json"], "does not exist"),
    pytest.param(["kernels", "{tmp}/nosuch"], "does not exist", marks=pytest.mark.needs_torch),
    pytest.param(["quantize", "{tmp}/nosuch", "{tmp}/out"], "does not exist", marks=pytest.mark.needs_torch),
    pytest.param(["serve-check", "{tmp}/nosuch", "--sglang-src", "{tmp}/nosuch"], "nosuch", marks=pytest.mark.needs_torch),
])
def test_every_command_refuses_a_missing_path_as_bad_input(tmp_path, args, said):
    _one_error(runner.invoke(app, [a.format(tmp=tmp_path) for a in args]), said)
