"""The SGLang patch set and its apply/check machinery, on trees the tests write themselves."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.serve import patches as P
from soarpack.serve.unidiff import apply_file_diff, parse_unified_diff

BACKEND = "sglang/srt/layers/attention/minicpm_backend.py"
KERNELS = "sglang/srt/layers/attention/minicpm_sparse_kernels.py"


def write_anchor_tree(root: Path) -> Path:
    """A tree holding, for each file our patches touch, only the lines the hunks anchor on (in header order)."""
    by_file = {}
    for patch in P.load_patches():
        for fd in patch.files:
            by_file.setdefault(fd.path, []).extend(fd.hunks)
    for rel, hunks in by_file.items():
        lines = []
        for hunk in sorted(hunks, key=lambda h: h.old_start):
            while len(lines) < hunk.old_start - 1:
                lines.append(f"# filler {len(lines)}")
            lines.extend(hunk.before)
        path = root / "python" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    return root / "python"


@pytest.fixture()
def tree(tmp_path):
    return write_anchor_tree(tmp_path / "fork")


def test_patch_set_is_ordered_and_documented():
    patches = P.load_patches()
    assert [p.name for p in patches] == ["sparse-dtype", "fp8-kv-query", "fp8-kv-compressed-keys", "w4-dispatch",
                                        "fp8-prefill", "gla-decode-in-place"]
    for p in patches:
        assert p.summary and "Concern:" in p.description, p.name
        assert all(f.path.startswith("sglang/srt/") and f.hunks for f in p.files)
    assert P.patch_dir() == Path(__file__).resolve().parent.parent / "sglang"


def test_patch_dir_prefers_the_checkout_then_the_packaged_copy(tmp_path):
    checkout, packaged = tmp_path / "sglang", tmp_path / "soarpack" / "sglang_patches"
    packaged.mkdir(parents=True)
    (packaged / "01-x.patch").write_text(SMALL_PATCH)
    assert P.find_patch_dir([checkout, packaged]) == packaged  # no checkout dir: the installed copy
    checkout.mkdir()
    assert P.find_patch_dir([checkout, packaged]) == packaged  # an empty checkout dir does not count
    (checkout / "01-x.patch").write_text(SMALL_PATCH)
    assert P.find_patch_dir([checkout, packaged]) == checkout
    with pytest.raises(P.ConfigError, match="no SGLang patch set found"):
        P.find_patch_dir([tmp_path / "nowhere"])


def test_clean_apply_then_already_applied(tree, tmp_path):
    before = {p: p.read_text() for p in tree.rglob("*.py")}
    report = P.check_tree(tree)
    assert [(p.name, p.status) for p in report.patches] == [
        ("sparse-dtype", "apply"), ("fp8-kv-query", "apply"), ("fp8-kv-compressed-keys", "apply"), ("w4-dispatch", "apply"),
        ("fp8-prefill", "apply"), ("gla-decode-in-place", "apply")]
    assert report.commit is None and report.state == "unknown"  # anchor lines only: no recorded commit

    out = tmp_path / "patched"
    report = P.apply_patches(tree, out, verify_compile=False)
    assert BACKEND in report.written and len(report.written) == 8
    assert {p: p.read_text() for p in tree.rglob("*.py")} == before  # the source is untouched
    patched = (out / BACKEND).read_text()
    assert "self.model_dtype = model_runner.dtype" in patched
    assert 'if self.attention_kernel_type != "flashinfer":' in patched
    assert "dtype=torch.bfloat16" not in patched
    assert (out / KERNELS).read_text().count("compressed_cache_ptr + head_offset") == 6

    again = P.check_tree(out)
    assert {p.status for p in again.patches} == {"applied"}
    assert P.apply_patches(out, out, verify_compile=False).written == []  # in place, nothing left to do


def test_in_place_apply_accepts_repo_root(tree):
    report = P.apply_patches(tree.parent, tree.parent, ["sparse-dtype"], verify_compile=False)
    assert report.written == [BACKEND]
    statuses = {p.name: p.status for p in P.check_tree(tree.parent).patches}
    assert statuses == {"sparse-dtype": "applied", "fp8-kv-query": "apply", "fp8-kv-compressed-keys": "apply",
                        "w4-dispatch": "apply", "fp8-prefill": "apply", "gla-decode-in-place": "apply"}


def test_drifted_file_names_file_line_and_text(tree, tmp_path):
    path = tree / BACKEND
    text = path.read_text()
    assert text.count('        dtype_str = "bfloat16"\n') == 1
    path.write_text(text.replace('        dtype_str = "bfloat16"\n', '        dtype_str = "float32"\n'))

    report = P.check_tree(tree)
    status = {p.name: p for p in report.patches}
    assert status["sparse-dtype"].status == "fail"
    assert status["fp8-kv-query"].status == "apply"  # other concerns are judged on their own
    (problem,) = status["sparse-dtype"].problems()
    assert problem.startswith(f"{BACKEND}:268: hunk 2 does not match (expected near line 263;")
    assert "has 'dtype_str = \"float32\"' where the patch expects 'dtype_str = \"bfloat16\"'" in problem

    out = tmp_path / "out"
    with pytest.raises(P.PatchError) as err:
        P.apply_patches(tree, out, verify_compile=False)
    assert "sparse-dtype" in err.value.message and f"{BACKEND}:268" in err.value.message
    assert "nothing was written" in err.value.hint
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_missing_file_is_reported_and_nothing_written(tree, tmp_path):
    (tree / KERNELS).unlink()
    report = P.check_tree(tree)
    status = {p.name: p for p in report.patches}
    assert status["fp8-kv-compressed-keys"].status == "fail"
    assert status["fp8-kv-compressed-keys"].problems() == [f"{KERNELS}: file not found in the tree"]
    out = tmp_path / "out"
    with pytest.raises(P.PatchError, match="file not found"):
        P.apply_patches(tree, out, verify_compile=False)
    assert not out.exists()


def test_half_patched_file_is_a_failure(tree, tmp_path):
    P.apply_patches(tree, tree, ["sparse-dtype"], verify_compile=False)
    text = (tree / BACKEND).read_text()
    # undo one of the six hunks by hand: now the file is neither pristine nor patched
    (tree / BACKEND).write_text(text.replace('dtype_str = "float16" if self.model_dtype == torch.float16 else "bfloat16"', 'dtype_str = "bfloat16"'))
    status = P.check_tree(tree, ["sparse-dtype"]).patches[0]
    assert status.status == "fail"
    assert "partly patched already" in status.problems()[0]


def test_unknown_patch_name_and_bad_src(tree, tmp_path):
    with pytest.raises(P.ConfigError, match="unknown SGLang patch 'nope'"):
        P.check_tree(tree, ["nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(P.ConfigError, match="holds no sglang/ package"):
        P.check_tree(tmp_path / "empty")
    with pytest.raises(P.ConfigError, match="does not exist"):
        P.check_tree(tmp_path / "absent")


# -- the engine on small handmade patches ---------------------------------------------------------------------

SMALL_PATCH = """\
soarpack patch: demo
Concern: demo: two look-alike blocks, the second is changed.

--- a/sglang/mod.py
+++ b/sglang/mod.py
@@ -6,3 +6,3 @@
 def g():
-    x = 1
+    x = 2
     return x
"""
SMALL_TREE = "def f():\n    x = 1\n    return x\n\n\ndef g():\n    x = 1\n    return x\n"


@pytest.fixture()
def small_set(tmp_path, monkeypatch):
    pdir = tmp_path / "patches"
    pdir.mkdir()
    (pdir / "01-demo.patch").write_text(SMALL_PATCH)
    monkeypatch.setenv(P.PATCHES_ENV, str(pdir))
    src = tmp_path / "src"
    (src / "sglang").mkdir(parents=True)
    (src / "sglang" / "mod.py").write_text(SMALL_TREE)
    return pdir, src


def test_hunk_goes_to_nearest_match_after_offset():
    _, files = parse_unified_diff(SMALL_PATCH)
    shifted = "import os\nimport sys\n" + SMALL_TREE  # every line moved down by 2
    out, results = apply_file_diff(shifted, files[0])
    assert [(r.status, r.line) for r in results] == [("apply", 8)]
    assert out == "import os\nimport sys\n" + SMALL_TREE.replace("def g():\n    x = 1", "def g():\n    x = 2")


def test_fork_commit_identified_by_hashes(small_set, tmp_path):
    pdir, src = small_set
    P.record_hashes({"abc1234": src})
    recorded = json.loads((pdir / "fork-hashes.json").read_text())["commits"]["abc1234"]
    assert set(recorded) == {"pristine", "patched"}
    report = P.check_tree(src)
    assert (report.commit, report.state) == ("abc1234", "pristine")
    P.apply_patches(src, src)
    report = P.check_tree(src)
    assert (report.commit, report.state, report.patches[0].status) == ("abc1234", "patched", "applied")
    (src / "sglang" / "mod.py").write_text(SMALL_TREE.replace("return x\n", "return x + 0\n", 1))
    report = P.check_tree(src)
    assert (report.commit, report.state, report.differing) == (None, "unknown", ["sglang/mod.py"])


def test_patched_file_that_does_not_compile_is_refused(small_set, tmp_path):
    pdir, src = small_set
    (pdir / "01-demo.patch").write_text(SMALL_PATCH.replace("+    x = 2", "+    x = = 2"))
    with pytest.raises(P.PatchError, match=r"sglang/mod.py:7: does not compile"):
        P.apply_patches(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert (src / "sglang" / "mod.py").read_text() == SMALL_TREE


# -- CLI ------------------------------------------------------------------------------------------------------


def test_cli_check(tree):
    runner = CliRunner()
    res = runner.invoke(app, ["sglang", "check", "--src", str(tree), "--json"])
    assert res.exit_code == 0, res.output
    assert {p["status"] for p in json.loads(res.stdout)["patches"]} == {"apply"}

    (tree / KERNELS).unlink()
    res = runner.invoke(app, ["sglang", "check", "--src", str(tree)])
    assert res.exit_code == 2
    assert "file not found in the tree" in res.output and "do not apply" in res.output

    res = runner.invoke(app, ["sglang", "list", "--json"])
    assert [p["name"] for p in json.loads(res.stdout)] == P.list_patches()


def test_cli_apply(small_set, tmp_path):
    _, src = small_set
    runner = CliRunner()
    out = tmp_path / "cli-out"
    res = runner.invoke(app, ["sglang", "apply", "--src", str(src), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "sglang" / "mod.py").read_text() == SMALL_TREE.replace("def g():\n    x = 1", "def g():\n    x = 2")
    res = runner.invoke(app, ["sglang", "apply", "--src", str(src), "--out", str(out)])
    assert res.exit_code == 2 and "not empty" in res.output  # no silent overwrite
    res = runner.invoke(app, ["sglang", "apply", "--src", str(src), "--out", str(out), "--force", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["written"] == ["sglang/mod.py"]


def test_stdlib_entry_point_runs_without_typer_rich_or_torch(small_set, tmp_path):
    import subprocess
    import sys

    _, src = small_set
    code = (
        "import sys, runpy\n"
        "for m in ('typer', 'rich', 'torch', 'pydantic', 'httpx'): sys.modules[m] = None\n"
        f"sys.argv = ['x', 'apply', '--src', {str(src)!r}, '--out', {str(tmp_path / 'std-out')!r}]\n"
        "runpy.run_module('soarpack.serve.patches', run_name='__main__')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["written"] == ["sglang/mod.py"]
    assert "x = 2" in (tmp_path / "std-out" / "sglang" / "mod.py").read_text()
    res = subprocess.run([sys.executable, "-m", "soarpack.serve.patches", "check", "--src", str(tmp_path / "std-out")],
                         capture_output=True, text=True, env=dict(os.environ))
    assert res.returncode == 0 and json.loads(res.stdout)["patches"][0]["status"] == "applied"
