"""Issue 39, inspect --steps: prepare_env.sh's exports are read as bash reads the script (never run). Held against
bash itself: every export the view shows, bash makes; every export bash makes, the view shows or names the line it
could not read. Each case is a bundle whose prepare_env.sh is replaced by a few lines."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.bundle.build import build_bundle
from soarpack.bundle.steps_view import platform_steps
from soarpack.bundle.tarpack import safe_extract, write_tarball
from soarpack.cli import app

CASES = {
    "here-document": "cat >/dev/null <<EOF\nexport FAKE=1\nEOF\ncat >/dev/null <<-'X'\n\texport FAKE2=1\n\tX\nexport REAL=2\n",
    "two-assignments-one-line": "A=1 B=2\nexport A B\n",
    "two-exports-one-line": "export C=3 D=4\n",
    "assignment-then-export-on-one-line": "E0=zero; export E0\n",
    "eval": "eval 'export E=5'\n",
    "declare-x": "declare -x F=6\ntypeset -x G=7\ndeclare H=8\nreadonly I=9\n",
    "joined-quotes": "export J=\"a\"'b'c\"d e\"\n",
    "subshell-and-pipeline": "(export K=9)\nexport L=10 | cat\n",
    "local-x": "f() {\n  local -x M=11\n}\nf\n",
    "case": "case x in\n  x|y) export N=12 ;;\n  \"z\") ;;\nesac\nexport O=13\n",
    "hash-inside-quotes": 'export P="x # not a comment"  # a comment\n',
    "set-a": "set -a\nQ=14\nset +a\n",
    "line-continuation": "export R=a\\\nb\n",
    "ansi-c": "export S=$'a\\tb'\n",
    "assignment-after-export": "export T=1\nT=2\n",
    "source-another-file": ". /dev/null\nexport U=1\n",
    "command-substitution": 'export V="$(echo computed)"\n',
    "temporary-assignment": "W=1 true\nexport X=$W\n",
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    work = tmp_path_factory.mktemp("steps")
    bundle = build_bundle(work / "b.tar.gz", wheels=False, calib_rows=8).path
    return safe_extract(bundle, work / "tree")


def bash_exports(script: Path, home: Path) -> dict:
    """What sourcing `script` really exports: env before and after, in a clean `env -i` bash."""
    probe = 'env -0 > "$1"; source "$2" >/dev/null 2>&1; env -0 > "$3"'
    a, b = home / "a", home / "b"
    subprocess.run(["env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", "bash", "--noprofile", "--norc", "-c", probe,
                    "p", str(a), str(script), str(b)], check=True, timeout=60, cwd=home)

    def read(p):
        return dict(item.split("=", 1) for item in p.read_bytes().decode().split("\0") if "=" in item)
    before, after = read(a), read(b)
    return {k: v for k, v in after.items() if before.get(k) != v and k not in ("_", "SHLVL", "OLDPWD", "PWD")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_exports_shown_are_the_ones_bash_makes(case, tree, tmp_path):
    work = tmp_path / "t"
    import shutil

    shutil.copytree(tree, work)
    (work / "prepare_env.sh").write_text(CASES[case])
    bundle = write_tarball(work, tmp_path / "b.tar.gz")
    (step,) = [s for s in platform_steps(bundle)["steps"] if s["name"] == "prepare_env.sh"]
    shown, unread = step["exports"], step.get("unread", [])
    home = tmp_path / "home"
    home.mkdir()
    real = bash_exports(work / "prepare_env.sh", home)
    assert set(shown) <= set(real), f"shown but bash does not export: {sorted(set(shown) - set(real))}"
    missing = set(real) - set(shown)
    assert not missing or unread, f"bash exports {sorted(missing)}, the view neither shows them nor says why"
    for name, values in shown.items():
        if "$" not in values[-1]:
            assert real[name] == values[-1], (name, values, real[name])


def test_the_lines_it_cannot_read_are_printed(tree, tmp_path):
    work = tmp_path / "t"
    import shutil

    shutil.copytree(tree, work)
    (work / "prepare_env.sh").write_text("export OK=1\neval \"export HIDDEN=1\"\nset -a\n")
    bundle = write_tarball(work, tmp_path / "b.tar.gz")
    res = CliRunner().invoke(app, ["inspect", "--steps", str(bundle)])
    assert res.exit_code == 0, res.output
    assert "export OK=1" in res.output and "HIDDEN" not in res.output.split("could not read")[0]
    assert "could not read line 2: eval" in res.output and "could not read line 3: set -a" in res.output
    data = json.loads(CliRunner().invoke(app, ["inspect", "--steps", "--json", str(bundle)]).output)
    (step,) = [s for s in data["steps"] if s["name"] == "prepare_env.sh"]
    assert [u["line"] for u in step["unread"]] == [2, 3]
