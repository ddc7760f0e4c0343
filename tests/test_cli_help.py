"""Every help page reads cleanly at 80 columns: no type metavars, no eaten markup, -h, an example, workflow order."""

import re

import pytest
from typer.testing import CliRunner

from soarpack.cli import WORKFLOW, app


def _help(*words):
    result = CliRunner().invoke(app, [*words, "-h"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def _commands(*group):
    text = _help(*group)
    listed = text.split("Commands:", 1)[1]
    # a command's description may wrap: its next lines are indented further
    return [line.split()[0] for line in listed.splitlines() if re.match(r"  \S", line)]




def _every_command():
    out = []
    for name in _commands():
        subs = _commands(name) if name in ("sglang", "wheels") else []
        words = [(name, sub) for sub in subs] or [(name,)]
        out += [pytest.param(w) for w in words]
    return out


def test_top_level_lists_commands_in_workflow_order():
    listed = _commands()
    ours = [name for name in listed if name in WORKFLOW]
    assert ours == [name for name in WORKFLOW if name in listed]
    assert listed[:4] == ["tiny-model", "calib", "quantize", "verify"] and "compare" in listed and "inspect" in listed


@pytest.mark.parametrize("words", [()] + _every_command(), ids=lambda w: " ".join(w) or "soarpack")
def test_help_page_is_clean_at_80_columns(words):
    text = _help(*words)
    for line in text.splitlines():
        assert len(line) <= 80, line
    assert "<bool>" not in text and "<int range>" not in text and "<list[" not in text and "<list" not in text
    assert "[]" not in text  # text in brackets eaten as markup
    assert "-h, --help" in text
    if words and words[0] not in ("sglang", "wheels") or len(words) == 2:
        assert "Example" in text, f"no example in soarpack {' '.join(words)} --help"


def test_speedset_mix_help_keeps_its_brackets():
    assert "[[input]] and [[output]]" in " ".join(_help("speedset").split())


def test_old_spellings_still_work_hidden(tmp_path):
    text = _help("eval")
    assert "--num-samples" not in text and "--model-path" not in text
    result = CliRunner().invoke(app, ["sglang", "check", "--src", str(tmp_path / "none")])
    assert "no such option" not in result.output.lower()
    assert result.exit_code == 2
