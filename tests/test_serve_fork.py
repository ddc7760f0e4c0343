"""Integration: our patch set against a real checkout of the OpenBMB minicpm_sala fork.

Runs on both commits' python/ trees from ../shared/data/sglang-fork (extracted per session), and also on
SOARPACK_SGLANG_SRC when it points at another checkout (the fork's python/ dir or the repository root).
"""

from __future__ import annotations

import os
import py_compile

import pytest

from soarpack.serve import patches as P
from soarpack.serve.lint import lint_args
from soarpack.recipe.profile import list_profiles, load_profile
from soarpack.serve.serverargs import builtin_flags, parse_server_args

ENV_SRC = os.environ.get("SOARPACK_SGLANG_SRC")
SOURCES = ["377b0b5eb", "d29fb130c"] + (["env"] if ENV_SRC else [])


@pytest.fixture(scope="module", params=SOURCES)
def SRC(request):
    if request.param == "env":
        return ENV_SRC
    return str(request.getfixturevalue("sglang_fork_trees")[request.param])


@pytest.fixture(scope="module")
def patched(tmp_path_factory, SRC):
    out = tmp_path_factory.mktemp("fork") / "patched"
    report = P.apply_patches(SRC, out)
    return out, report


def test_every_patch_applies_and_the_tree_is_known(SRC):
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


def test_profiles_lint_clean_against_the_tree(SRC):
    tree = P.resolve_src(SRC)
    flags = parse_server_args(tree)
    assert set(flags) == set(builtin_flags())  # the recorded table is this fork's
    for name in list_profiles():
        prof = load_profile(name)
        assert lint_args(prof.args, recipe=prof.recipe, patched=set(prof.patches), server_args_py=tree) == []
