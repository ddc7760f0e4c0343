"""Integration: our patch set against a real checkout of the OpenBMB minicpm_sala fork.

Runs when SOARPACK_SGLANG_SRC points at the fork's python/ directory (or the repository root), e.g. one
extracted with `git -C MIRROR archive d29fb130c python | tar -x -C /tmp/sglang-d29`.
"""

from __future__ import annotations

import os
import py_compile

import pytest

from soarpack.serve import patches as P
from soarpack.serve.lint import lint_args
from soarpack.serve.profiles import list_profiles, load_profile
from soarpack.serve.serverargs import builtin_flags, parse_server_args

SRC = os.environ.get("SOARPACK_SGLANG_SRC")
pytestmark = pytest.mark.skipif(not SRC, reason="SOARPACK_SGLANG_SRC is not set: point it at a minicpm_sala fork's python/ dir to run")


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    out = tmp_path_factory.mktemp("fork") / "patched"
    report = P.apply_patches(SRC, out)
    return out, report


def test_every_patch_applies_and_the_tree_is_known():
    report = P.check_tree(SRC)
    assert [(p.name, p.status) for p in report.patches] == [(n, "apply") for n in P.list_patches()], report.to_dict()
    assert report.commit is not None and report.state == "pristine", (report.commit, report.state, report.differing)


def test_patched_files_compile_and_check_as_applied(patched, tmp_path):
    out, report = patched
    assert report.written
    for rel in report.written:
        py_compile.compile(str(out / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)
    again = P.check_tree(out)
    assert {p.status for p in again.patches} == {"applied"}
    assert (again.commit, again.state) == (report.commit, "patched")


def test_profiles_lint_clean_against_the_tree():
    tree = P.resolve_src(SRC)
    flags = parse_server_args(tree)
    assert set(flags) == set(builtin_flags())  # the recorded table is this fork's
    for name in list_profiles():
        prof = load_profile(name)
        assert lint_args(prof.args, recipe=prof.recipe, patched=set(prof.patches), server_args_py=tree) == []
