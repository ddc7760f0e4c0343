"""What a first-time reader of the help pages trips over (issue 27, item 8): usage lines name arguments plainly, a
list argument has its Arguments entry, the command list is not cut, required options say so, every flag the README
promises exists, shell completion answers, the calib histogram is to scale, serve-check's columns all have a name."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.cli.helpformat import SHORT_HELP_LIMIT
from soarpack.cli.quant import HISTOGRAM_WIDTH, histogram_bar

ROOT = Path(__file__).resolve().parent.parent


def _help(*words, width=80):
    result = CliRunner().invoke(app, [*words, "-h"], env={"COLUMNS": str(width)}, terminal_width=width)
    assert result.exit_code == 0, result.output
    return result.output


def _root():
    return typer.main.get_command(app)


def _commands():
    """{"quantize": click command, "sglang check": ..., ...} for every command, hidden ones too."""
    out = {}
    for name, cmd in _root().commands.items():
        if hasattr(cmd, "commands"):  # a group (sglang, wheels, cache): its subcommands
            out.update({f"{name} {sub}": c for sub, c in cmd.commands.items()})
        else:
            out[name] = cmd
    return out


def _flags(cmd):
    return {"-h", "--help"} | {opt for p in cmd.params if p.param_type_name == "option" for opt in (*p.opts, *p.secondary_opts)}


def _usage(words):
    return next(line for line in _help(*words.split()).splitlines() if line.startswith("Usage:"))


@pytest.mark.parametrize("words", sorted(_commands()))
def test_usage_lines_name_arguments_without_braces(words):
    assert "{" not in _usage(words) and "}" not in _usage(words), _usage(words)


def test_usage_lines_read_as_click_writes_them():
    assert _usage("quantize").endswith("quantize [OPTIONS] MODEL_DIR OUT")
    assert _usage("check").endswith("check [OPTIONS] [BUNDLE]")
    assert _usage("calib").endswith("calib [OPTIONS] [FILES]...")
    assert _usage("compare").endswith("compare [OPTIONS] RESULTS...")
    assert _help().splitlines()[0].endswith("[OPTIONS] COMMAND [ARGS]...")


@pytest.mark.parametrize("words, name", [("calib", "FILES"), ("compare", "RESULTS")])
def test_a_list_argument_has_its_arguments_entry(words, name):
    text = _help(words)
    arguments = text.split("Arguments:", 1)[1].split("Options:", 1)[0]
    assert re.search(rf"^  {name}\.\.\.  +\S", arguments, re.M), arguments
    assert "<list" not in text and "<path>" not in arguments


@pytest.mark.parametrize("width", [80, 120])
def test_the_command_list_is_never_cut(width):
    text = _help(width=width)
    listed = text.split("Commands:", 1)[1]
    assert "..." not in listed, listed
    assert max(len(line) for line in text.splitlines()) <= width
    if width > 80:  # it uses a wider terminal
        assert max(len(line) for line in text.splitlines()) > 80


@pytest.mark.parametrize("words", sorted(_commands()))
def test_every_first_sentence_is_short(words):
    short = _commands()[words].get_short_help_str(SHORT_HELP_LIMIT)
    assert not short.endswith("...") and len(short) <= 120, f"soarpack {words}: {short!r}"


def _required_by_hand():
    """(command, flag) for every `required(value, "--flag")` in soarpack/cli: an option Typer cannot mark itself
    (it has a hidden old spelling), so its help must say [required]."""
    found = []
    for path in sorted((ROOT / "soarpack" / "cli").glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(fn, ast.FunctionDef):
                continue
            names = [d.args[-1].value for d in fn.decorator_list if isinstance(d, ast.Call) and d.args
                     and isinstance(d.args[-1], ast.Constant) and isinstance(d.args[-1].value, str)]
            groups = [d.args[0].id for d in fn.decorator_list if isinstance(d, ast.Call)
                      and getattr(d.func, "id", "") == "subcommand" and isinstance(d.args[0], ast.Name)]
            for call in ast.walk(fn):
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "required" and names:
                    group = groups[0].replace("_app", "") + " " if groups else ""
                    found.append((group + names[0], call.args[1].value))
    return found


def test_the_scan_finds_the_hand_required_options():
    assert ("calib", "--model-dir") in _required_by_hand() and ("sglang apply", "--output") in _required_by_hand()


@pytest.mark.parametrize("words, flag", _required_by_hand())
def test_required_options_are_marked(words, flag):
    text = _help(*words.split(), width=200)
    line = next(line for line in text.splitlines() if re.match(rf"\s+(-\w, )?{flag}\b", line))
    assert "[required]" in line, line


# -- the README's promises ------------------------------------------------------------------------------------------


def _readme_invocations():
    """(command words, flags) for each `soarpack ...` the README writes, in code spans and code blocks."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").replace("\\|", "|")
    snippets = re.findall(r"`([^`\n]*soarpack [^`\n]*)`", text)
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S):
        snippets += [line for line in block.replace("\\\n", " ").splitlines() if "soarpack " in line]
    commands = _commands()
    groups = {n for n, c in _root().commands.items() if hasattr(c, "commands")}
    out = []
    for snippet in snippets:
        for part in re.split(r"&&|\|\s|;|(?<=\s)#", snippet):
            words = part.split()
            starts = [i for i, w in enumerate(words) if re.fullmatch(r"(\S*/)?soarpack", w)]
            if not starts:
                continue
            words = words[starts[0] + 1:]
            globals_ = [w for w in words[:next((i for i, w in enumerate(words) if not w.startswith("-")
                                                and not (i and words[i - 1] == "--format")), len(words))]]
            rest = words[len(globals_):]
            if not rest:
                continue
            name = rest[0]
            if name in groups and len(rest) > 1:
                names = [f"{name} {sub}" for sub in rest[1].split("/")]
            else:
                names = [name]
            flags = [w.strip("[]…,.").split("=")[0] for w in rest[1:] if re.match(r"\[?-{1,2}[A-Za-z]", w)]
            for n in names:
                if n in commands:
                    out.append((n, tuple(f for f in flags if f), tuple(g for g in globals_ if g.startswith("-"))))
    return out


def test_the_readme_scan_sees_the_command_table():
    seen = {name for name, _, _ in _readme_invocations()}
    assert {"quantize", "build", "check", "speedset", "sglang check", "sglang apply", "compare"} <= seen


@pytest.mark.parametrize("name, flags, global_flags", _readme_invocations(), ids=lambda v: str(v))
def test_every_flag_the_readme_writes_exists(name, flags, global_flags):
    cmd = _commands()[name]
    assert set(flags) <= _flags(cmd), f"soarpack {name} has no {sorted(set(flags) - _flags(cmd))}"
    assert set(global_flags) <= _flags(_root())


def test_the_readmes_naming_rules_hold_for_every_command():
    """README: `-o/--output` for output files, `-n/--rows` for row counts; the old spellings are hidden aliases."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "`-o/--output`" in readme and "`-n/--rows` for row counts" in readme
    for name, cmd in _commands().items():
        for param in cmd.params:
            opts = set(param.opts)
            if "--rows" in opts:
                assert "-n" in opts, f"soarpack {name} has --rows but no -n"
            if "--output" in opts:
                assert "-o" in opts, f"soarpack {name} has --output but no -o"
            if "--out" in opts:
                assert param.hidden, f"soarpack {name} shows --out, the old spelling of --output"


# -- shell completion -----------------------------------------------------------------------------------------------


def test_shell_completion_is_offered_and_completes_commands():
    text = _help()
    assert "--install-completion" in text and "--show-completion" in text
    env = {"_SOARPACK_COMPLETE": "complete_bash", "COMP_WORDS": "soarpack qua", "COMP_CWORD": "1"}
    result = CliRunner().invoke(app, [], env=env, prog_name="soarpack")
    assert result.output.split() == ["quantize"]
    env = {"_SOARPACK_COMPLETE": "complete_bash", "COMP_WORDS": "soarpack build --re", "COMP_CWORD": "2"}
    assert CliRunner().invoke(app, [], env=env, prog_name="soarpack").output.split() == ["--recipe"]


# -- the calib histogram --------------------------------------------------------------------------------------------


def test_histogram_bars_are_scaled_to_the_largest_bucket():
    assert len(histogram_bar(141, 141)) == HISTOGRAM_WIDTH
    assert len(histogram_bar(68, 141)) == round(HISTOGRAM_WIDTH * 68 / 141) < HISTOGRAM_WIDTH
    assert histogram_bar(1, 100_000) == "#" and histogram_bar(0, 141) == ""
    assert len(histogram_bar(10_000, 20_000)) == HISTOGRAM_WIDTH // 2  # no cap hides the large counts


def test_calib_draws_different_counts_as_different_lengths(tmp_path):
    from tiny_tokenizer import make_tiny_tokenizer

    tok = make_tiny_tokenizer(tmp_path / "tok")
    rows = tmp_path / "mix.jsonl"
    long_rows = [f"long row {i} " + " ".join(f"w{i}x{j}" for j in range(200)) for i in range(68)]
    short_rows = [f"short row {i} " + " ".join(f"s{i}y{j}" for j in range(30)) for i in range(141)]
    rows.write_text("".join(json.dumps({"text": t}) + "\n" for t in long_rows + short_rows))
    result = CliRunner().invoke(app, ["calib", str(rows), "--model-dir", str(tok), "-n", str(68 + 141)])
    assert result.exit_code == 0, result.output
    bars = {int(m.group(1)): len(m.group(2)) for m in re.finditer(r"^\s+\S+-\S+\s+(\d+) ?(#*)$", result.stdout, re.M)}
    counts = sorted(n for n in bars if n)
    assert len(counts) >= 2, result.stdout
    assert len({bars[n] for n in counts}) == len(counts), bars  # different counts, different lengths
    assert bars[max(counts)] == HISTOGRAM_WIDTH


# -- serve-check's table --------------------------------------------------------------------------------------------


def test_serve_checks_table_names_every_column():
    from soarpack.serve.forkcheck import ModuleRow, render_table

    table = render_table([ModuleRow("model.layers.0.mlp.gate_up_proj", "GPTQMarlinLinearMethod", 4, 128, "W4 g128",
                                    True)], [])
    header, rule, row = table.splitlines()[:3]
    assert len(header.split()) >= len(row.split()) and header.split()[-1] == "check"
    assert row.split()[-1] == "ok" and len(rule.split()) == 5
