"""build -> check end to end on a tiny SALA model, with a small wheel set really installed offline into the overlay venv.

The CI wheel set is one pure wheel made at test time (soarpack-ci-probe); the real platform set (CPython 3.10
wheels, ~130 MB from PyPI) is covered by test_bundle_wheels.py's lock checks and, when the local cache is full,
by test_real_wheel_bundle_checks_its_tags.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.bundle.build import build_bundle
from soarpack.rehearse.check import FAIL, PASS, SKIP, STEPS, check_bundle
from soarpack.rehearse.installer import find_installer
from soarpack.rehearse.probes import source_prepare_env
from soarpack.bundle.tarpack import pack_tree, safe_extract
from soarpack.bundle.wheels import collect_wheels, default_cache_dir, load_lock, make_pure_wheel
from soarpack.cli import app
from soarpack.sala.tiny import make_tiny_model
from test_bundle_scripts import _bare_bundle, _one_line_cause, _preprocess

pytestmark = pytest.mark.slow
os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
runner = CliRunner()


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("bundle-e2e")


@pytest.fixture(scope="module")
def ci_wheels(work):
    d = work / "wheels"
    make_pure_wheel(d, "soarpack-ci-probe", "1.2.3", {"soarpack_ci_probe.py": "ANSWER = 42\n"})
    return d


@pytest.fixture(scope="module")
def bundle(work, ci_wheels):
    out = work / "submission.tar.gz"
    res = runner.invoke(app, ["build", "--wheel-dir", str(ci_wheels), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def checked(work, bundle):
    rehearsal = work / "rehearsal"
    report = check_bundle(bundle, work_dir=rehearsal, keep=True, dev_stack=True)
    return report, rehearsal


def _status(report):
    return {s.name: s.status for s in report.steps}


def test_check_passes_every_step_it_can_run_and_skips_the_rest_with_reasons(checked):
    report, _ = checked
    status = _status(report)
    assert report.ok, [(s.name, s.detail) for s in report.steps if s.status == FAIL]
    for name in ("extract", "size", "structure", "credentials", "wheel tags", "scripts syntax", "args lint", "image stand-in",
                 "prepare_env.sh", "bundled wheels", "tiny model", "prepare_model.sh", "verify"):
        assert status[name] == PASS, name
    assert status["server start"] == SKIP and report["server start"].data == {"needs": "gpu"}
    assert list(status) == [s.name for s in STEPS]  # every declared step, in order, whatever happened
    for s in report.steps:
        assert s.seconds >= 0
        if s.status == SKIP:
            assert s.detail  # never skipped without a reason
    assert report.gate() == {"failed": [], "not_run": [], "risks": []} and report.logs_dir is None


def test_wheels_were_installed_offline_into_the_overlay_and_soarpack_comes_from_the_bundle(checked):
    _, rehearsal = checked
    overlay = rehearsal / "bundle" / ".soarpack" / "venv" / "bin" / "python"
    out = subprocess.run([str(overlay), "-c", "import soarpack_ci_probe, soarpack; print(soarpack_ci_probe.ANSWER, soarpack.__file__)"],
                         capture_output=True, text=True, check=True, cwd=rehearsal).stdout.split()
    assert out[0] == "42"
    assert out[1].startswith(str(rehearsal / "bundle" / "src"))
    log = (rehearsal / "bundle" / "logs" / "prepare_env.log").read_text()
    assert "--no-index" in log


def test_quantized_checkpoint_and_logs(checked):
    _, rehearsal = checked
    q = rehearsal / "quantized"
    config = json.loads((q / "config.json").read_text())
    assert config["quantization_config"]["bits"] == 4
    log = (rehearsal / "bundle" / "logs" / "prepare_model.log").read_text()
    assert "phase quantize: ok" in log and "phase verify: ok" in log and "exit 0" in log


def test_the_rehearsal_names_the_library_warnings_in_quantize_log_not_their_lines(checked):
    """Issue 27 item 3: the step says how many library warnings the tiny quantize wrote, and to which log."""
    report, rehearsal = checked
    step = report["prepare_model.sh"]
    quantize_log = rehearsal / "bundle" / "logs" / "quantize.log"
    assert step.data["library_log"] == str(quantize_log) and step.data["library_warnings"] > 0
    n = step.data["library_warnings"]
    assert step.detail.endswith(f"; {n} library warning{'s' if n != 1 else ''} in the bundle's logs/quantize.log")
    assert "Failed to load" in quantize_log.read_text(errors="replace") or "W1201" in quantize_log.read_text(errors="replace")


def test_sourcing_again_is_idempotent(checked, bundle):
    report, rehearsal = checked
    root = rehearsal / "bundle"
    env = dict(os.environ, SOARPACK_IMAGE_PYTHON=str(rehearsal / "image" / "bin" / "python"), SOARPACK_SKIP_SGLANG="1")
    values = source_prepare_env(root, env, cwd=rehearsal)
    assert values["ALIVE"] == "1"
    assert "already prepared" in values["_stdout"]
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert values["ARGS"] == manifest["profile"]["args_string"]


def test_cli_check_json(bundle):
    res = runner.invoke(app, ["check", str(bundle), "--no-rehearse", "--json"])
    assert res.exit_code == 1, res.output  # nothing failed, but nothing was rehearsed: not uploadable
    data = json.loads(res.output)
    steps = {s["name"]: s for s in data["steps"]}
    assert data["ok"] and steps["image stand-in"]["status"] == SKIP and steps["image stand-in"]["detail"] == "--no-rehearse"
    rehearsal = [s.name for s in STEPS][STEPS.index(next(s for s in STEPS if s.name == "image stand-in")):]
    assert all(steps[name]["status"] == SKIP for name in rehearsal)
    assert all(steps[name]["data"]["cause"] == "image stand-in" for name in rehearsal[1:])
    assert data["gate"] == {"failed": [], "not_run": ["prepare_env.sh", "bundled wheels", "prepare_model.sh", "verify"],
                            "risks": []}
    assert not data["uploadable"] and data["not_uploadable_because"].startswith("not rehearsed")
    # the e2e bundle is the default profile (fast-gla: its patches unmeasured on the platform) calibrated on the built-in
    # prompts: two risks that are printed and do not block
    assert [(r["name"], r["blocks"]) for r in data["risks"]] == [("profile-flagged", False), ("calib-builtin", False)]
    assert data["logs_dir"] is None and data["versions"]["python"]
    assert json.loads(runner.invoke(app, ["--format", "json", "check", str(bundle), "--no-rehearse"]).stdout)["gate"] \
        == data["gate"]


def test_a_dev_stack_rehearsal_passes_but_is_never_uploadable(checked):
    report, _ = checked
    assert report.ok and report.stack == "development stack" and not report.uploadable
    assert "development stack" in report.not_uploadable_because
    step = next(s for s in report.steps if s.name == "prepare_model.sh")
    import sys
    assert step.versions["python"] == sys.version.split()[0]  # reported by the interpreter, not a label


def test_tampered_bundle_fails_structure_and_is_not_rehearsed(work, bundle):
    root = safe_extract(bundle, work / "tamper")
    with open(root / "prepare_model.sh", "a") as fh:
        fh.write("\n# changed after build\n")
    tampered = pack_tree(root, work / "tampered.tar.gz")
    report = check_bundle(tampered)
    status = _status(report)
    assert status["structure"] == FAIL and any("prepare_model.sh" in p for p in report["structure"].data["problems"])
    dependants = {"args lint", "image stand-in", "prepare_env.sh", "bundled wheels", "wheels on CPython 3.10", "sglang patches",
                  "tiny model", "prepare_model.sh", "verify", "fork loads it", "server start"}
    assert {name for name, st in status.items() if st == SKIP} == dependants and not report.ok
    assert all(report[name].data["cause"] == "structure" for name in dependants)
    assert report["args lint"].detail == "needs structure, which failed"
    res = runner.invoke(app, ["check", str(tampered), "--no-rehearse"])
    assert res.exit_code == 1


def test_unsafe_tarball_fails_extraction(work):
    evil = work / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../prepare_env.sh")
        tar.addfile(info)
    report = check_bundle(evil)
    assert [(s.name, s.status) for s in report.steps[:2]] == [("size", PASS), ("extract", FAIL)]
    assert all(s.status == SKIP and s.data["cause"] == "extract" for s in report.steps[2:])
    assert "'..'" in report["extract"].detail
    assert not (work / "prepare_env.sh").exists()


def test_bundle_with_a_credential_fails_check(work, bundle):
    root = safe_extract(bundle, work / "cred")
    (root / ".netrc").write_text("machine x login y password z\n")
    report = check_bundle(pack_tree(root, work / "cred.tar.gz"), rehearse=False)
    assert _status(report)["credentials"] == FAIL and ".netrc" in report["credentials"].detail


def test_preprocess_reports_a_failing_quantize_and_leaves_no_output(tmp_path):
    root = _bare_bundle(tmp_path, {"quantize": {"recipe": "no-such-recipe", "calib": []}, "files": {}})
    inp = make_tiny_model(tmp_path / "in", num_layers=2)
    out = tmp_path / "out"
    res = _preprocess(root, "--input", str(inp), "--output", str(out))
    assert res.returncode == 1
    cause = _one_line_cause(res)
    assert "phase quantize failed" in cause and "no-such-recipe" in cause, cause
    assert not out.exists() or not any(out.iterdir())
    assert "phase validate: ok" in res.stdout


def _cache_is_full() -> bool:
    cache = default_cache_dir()
    try:
        names = {p.name.split("-")[0].lower().replace("_", "-") for p in cache.glob("*.whl")}
        return all(w.name in names or w.name.replace("-", "_") in names for w in load_lock())
    except Exception:
        return False


@pytest.mark.skipif(not _cache_is_full(), reason="the real platform wheel set is not in the local cache (soarpack build fills it)")
def test_real_wheel_bundle_checks_its_tags(work):
    result = build_bundle(work / "real.tar.gz", calib_rows=8)
    assert len(result.manifest["wheels"]["files"]) == len(load_lock())
    report = check_bundle(result.path, rehearse=False)
    assert _status(report)["wheel tags"] == PASS


@pytest.fixture(scope="module")
def fp8_bundle(work):
    from soarpack.recipe.profile import load_profile

    if not load_profile("fp8-kv").patches:
        pytest.skip("the fp8-kv profile needs no patches any more")
    return build_bundle(work / "fp8.tar.gz", profile="fp8-kv", wheels=False, calib_rows=8).path


def test_patches_that_do_not_apply_fail_the_rehearsal_and_export_the_fallback(work, fp8_bundle):
    fork = work / "not-the-fork" / "python" / "sglang"
    fork.mkdir(parents=True)
    (fork / "__init__.py").write_text("")
    rehearsal = work / "fallback"
    report = check_bundle(fp8_bundle, sglang_src=fork.parent, work_dir=rehearsal, keep=True, dev_stack=True)
    step = report["prepare_env.sh"]
    assert step.status == FAIL and "FALLBACK" in step.detail
    assert _status(report)["prepare_model.sh"] == SKIP and report["prepare_model.sh"].data["cause"] == "prepare_env.sh"
    assert report.logs_dir == str(rehearsal)  # --keep: the logs stay where they are
    log = (rehearsal / "bundle" / "logs" / "prepare_env.log").read_text()
    manifest = json.loads((rehearsal / "bundle" / "MANIFEST.json").read_text())
    assert f"SGLANG_SERVER_ARGS={manifest['profile']['fallback_args']}" in log
    assert not (fork / "srt").exists()  # the user's folder is never touched


@pytest.fixture(scope="module")
def fork_src(sglang_fork_trees):
    """SOARPACK_SGLANG_SRC when set, else the fork at the image's commit from ../shared/data/sglang-fork."""
    return os.environ.get("SOARPACK_SGLANG_SRC") or str(sglang_fork_trees["377b0b5eb"])


def test_patches_apply_in_place_to_a_copy_of_the_real_fork(work, fp8_bundle, fork_src):
    from soarpack.serve.patches import check_tree

    src = fork_src
    before = check_tree(src).state
    report = check_bundle(fp8_bundle, sglang_src=src, rehearse=True, dev_stack=True)
    # fp8_bundle has no wheels, so only that step may fail
    assert [s.name for s in report.steps if s.status == FAIL] == ["bundled wheels"]
    assert _status(report)["sglang patches"] == PASS and report["sglang patches"].data["fork_commit"]
    assert check_tree(src).state == before  # the user's checkout is untouched


needs_py310 = pytest.mark.skipif(__import__("soarpack.bundle.wheels", fromlist=["x"]).find_python310() is None,
                                 reason="no CPython 3.10 here")


@needs_py310
def test_wheel_set_missing_a_dependency_fails_on_python310(work):
    from soarpack.rehearse.probes import wheels_on_python310
    from soarpack.steps import StepFailed

    d = work / "needy"
    make_pure_wheel(d, "needy", "1.0", {"needy.py": ""}, requires=["absent-dependency"])
    with pytest.raises(StepFailed, match="needy 1.0 requires absent-dependency"):
        wheels_on_python310(d, work / "needy-venv")


@needs_py310
@pytest.mark.skipif(not _cache_is_full(), reason="the real platform wheel set is not in the local cache")
def test_real_wheel_set_installs_offline_on_python310_complete_but_torch(work):
    from soarpack.rehearse.probes import wheels_on_python310

    d = work / "real-wheels"
    collect_wheels(d)
    data = wheels_on_python310(d, work / "real-venv")
    assert data["numpy"] == "2.2.6" and data["transformers"] == "5.20.2"


def test_bundle_with_a_patched_tree_records_the_fork_commit(work, fork_src):
    from soarpack.serve.patches import check_tree

    result = build_bundle(work / "tree.tar.gz", profile="fp8-kv", sglang_src=fork_src, wheels=False,
                          calib_rows=8)
    sglang = result.manifest["sglang"]
    assert sglang["mode"] == "tree" and sglang["fork_commit"] == check_tree(fork_src).commit
    # the real fork's python/ holds one link into the rest of its checkout; it would dangle in the bundle
    assert [w for w in result.warnings if "not shipped" in w and ".clang-format" in w]
    root = safe_extract(result.path, work / "tree")
    assert {p.status for p in check_tree(root / "sglang" / "python", sglang["patches"]).patches} == {"applied"}
    report = check_bundle(result.path, rehearse=False)
    assert report.ok


def test_keep_folder_must_be_empty(work, bundle):
    res = runner.invoke(app, ["check", str(bundle), "--keep", str(work)])
    assert res.exit_code == 2 and "not empty" in res.output


def test_oversize_bundle_fails_check_before_extraction(bundle, monkeypatch):
    from soarpack.bundle import layout

    monkeypatch.setattr(layout, "MAX_BYTES", 1000)
    report = check_bundle(bundle)
    assert report["size"].status == FAIL and "over the platform" in report["size"].detail
    assert report["size"].data == {"bytes": bundle.stat().st_size, "limit": 1000}
    assert all(s.status == SKIP and s.data["cause"] == "size" for s in report.steps[1:])


@pytest.mark.skipif(find_installer().uv is None,
                    reason="no uv beside this Python or on PATH (the platform's installer; `pip install uv`)")
def test_rehearsal_with_uv_like_the_platform(checked):
    """Issue 27 item 2: the venv's uv (beside sys.executable, not on PATH: the quick start does not activate the
    venv) is what the rehearsal installs with, and the step line and the JSON say so, and why."""
    report, rehearsal = checked
    found = find_installer()
    log = (rehearsal / "bundle" / "logs" / "prepare_env.log").read_text()
    assert "run: uv venv --system-site-packages" in log and "run: uv pip install" in log and "--offline --no-index" in log
    assert report.installer == {"name": "uv pip", "uv": found.uv, "why": found.why, "ran": "uv pip"}
    assert report.to_dict()["installer"]["ran"] == "uv pip"
    wheels = report["bundled wheels"]
    assert f"into the overlay venv with uv pip ({found.why})" in wheels.detail
    assert wheels.data["installer"] == "uv pip" and f"installer uv pip ({found.why})" in report["image stand-in"].detail


def test_rehearsal_without_uv_installs_with_pip_and_says_why(work, bundle, monkeypatch):
    from soarpack.rehearse import installer

    no_uv = installer.Installer(installer.PIP, None, "no uv beside soarpack's Python (X) or on PATH")
    monkeypatch.setattr(installer, "find_installer", lambda: no_uv)
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "uv").exists()]
    monkeypatch.setenv("PATH", os.pathsep.join(path))
    rehearsal = work / "pip-rehearsal"
    report = check_bundle(bundle, work_dir=rehearsal, keep=True, dev_stack=True)
    assert report.ok, [(s.name, s.detail) for s in report.steps if s.status == FAIL]
    log = (rehearsal / "bundle" / "logs" / "prepare_env.log").read_text()
    assert "run: uv " not in log and "-m pip install" in log
    assert report.installer["name"] == report.installer["ran"] == "pip"
    assert f"with pip ({no_uv.why})" in report["bundled wheels"].detail


