"""`soarpack inspect --steps`: the platform's steps read from the bundle, held against what its scripts really do."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.bundle.build import build_bundle
from soarpack.bundle.steps_view import BUNDLE, ORIGINAL, QUANTIZED, platform_steps
from soarpack.bundle.tarpack import safe_extract
from soarpack.cli import app
from soarpack.errors import SoarpackError
from soarpack.serve.server import launch_command

runner = CliRunner()


@pytest.fixture(scope="module")
def fp8_bundle(tmp_path_factory):
    """A bundle whose profile has patches, so its fallback args differ from its args."""
    work = tmp_path_factory.mktemp("steps")
    calib = work / "mine.jsonl"
    calib.write_text(json.dumps({"text": "hello world " * 20}) + "\n")
    path = build_bundle(work / "b.tar.gz", profile="fp8-kv", calib=[calib], wheels=False).path
    root = safe_extract(path, work / "x")
    return path, Path(root)


def _step(view, name):
    return next(s for s in view["steps"] if s["name"] == name)


def test_steps_are_in_the_platforms_order_with_their_logs(fp8_bundle):
    view = platform_steps(fp8_bundle[0])
    assert [s["name"] for s in view["steps"]] == ["prepare_env.sh", "prepare_model.sh", "server", "eval", "bench"]
    assert _step(view, "prepare_env.sh")["logs"] == [f"{BUNDLE}/logs/prepare_env.log"]
    assert _step(view, "prepare_model.sh")["logs"] == [f"{BUNDLE}/logs/prepare_model.log"]
    runs = _step(view, "prepare_model.sh")["runs"]
    assert [r["phase"] for r in runs] == ["quantize", "verify"]
    assert runs[0]["logs"] == [f"{BUNDLE}/logs/quantize.log"]


def test_the_exports_are_what_sourcing_prepare_env_really_exports(fp8_bundle, tmp_path):
    path, root = fp8_bundle
    exports = _step(platform_steps(path), "prepare_env.sh")["exports"]
    probe = 'env -0 > "$1"; source "$2/prepare_env.sh" >/dev/null 2>&1; env -0 > "$3"'
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SOARPACK_", "SGLANG_"))}
    env.update(SOARPACK_IMAGE_PYTHON=str(tmp_path / "no-python"), SOARPACK_SGLANG_FORK=str(tmp_path / "no-fork"))
    subprocess.run(["bash", "--noprofile", "--norc", "-c", probe, "p", str(tmp_path / "a"), str(root), str(tmp_path / "b")],
                   env=env, check=True, timeout=120)

    def read(p):
        return dict(item.split("=", 1) for item in p.read_text().split("\0") if "=" in item)

    before, after = read(tmp_path / "a"), read(tmp_path / "b")
    new = {k: v for k, v in after.items() if before.get(k) != v and k not in ("_", "SHLVL", "OLDPWD", "PWD")}
    assert set(new) <= set(exports), sorted(set(new) - set(exports))
    here = lambda v: v.replace(BUNDLE, str(root))  # noqa: E731
    assert here(exports["SOARPACK_PYTHON"][0]) == new["SOARPACK_PYTHON"]
    assert here(exports["SOARPACK_BUNDLE_DIR"][0]) == new["SOARPACK_BUNDLE_DIR"]
    # No fork here: the patches cannot install, so the fallback args are what got exported; the view lists both.
    assert any(v.startswith(new["SGLANG_SERVER_ARGS"]) and "fallback" in v for v in exports["SGLANG_SERVER_ARGS"])
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert exports["SGLANG_SERVER_ARGS"][0] == manifest["profile"]["args_string"]
    assert new["SGLANG_SERVER_ARGS"] == manifest["profile"]["fallback_args"] != manifest["profile"]["args_string"]


def test_the_quantize_line_is_preprocess_models_own(fp8_bundle, tmp_path):
    path, root = fp8_bundle
    spec = importlib.util.spec_from_file_location("bundle_preprocess", root / "preprocess_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    manifest = json.loads((root / "MANIFEST.json").read_text())
    theirs = module.quantize_command(manifest, tmp_path / "in", tmp_path / "out", False)
    theirs = [a.replace(str(root), BUNDLE).replace(str(tmp_path / "in"), ORIGINAL).replace(str(tmp_path / "out"), QUANTIZED)
              for a in theirs]
    theirs[0] = "$SOARPACK_PYTHON"
    runs = _step(platform_steps(path), "prepare_model.sh")["runs"]
    assert runs[0]["command"] == " ".join(theirs)
    assert f"--calib {BUNDLE}/calib/" in runs[0]["command"]


def test_the_server_line_is_the_platforms_launch_line_with_the_bundles_args(fp8_bundle):
    path, root = fp8_bundle
    manifest = json.loads((root / "MANIFEST.json").read_text())
    line = _step(platform_steps(path), "server")["command"]
    assert shlex.split(line) == launch_command(QUANTIZED, manifest["profile"]["args"], 30000, python="python")


def test_cli_prints_the_steps_text_and_json(fp8_bundle):
    path, _ = fp8_bundle
    result = runner.invoke(app, ["inspect", "--steps", str(path)])
    assert result.exit_code == 0, result.output
    for text in ("1. source BUNDLE/prepare_env.sh", "export SGLANG_SERVER_ARGS=", "log: BUNDLE/logs/quantize.log",
                 "sglang.launch_server --model-path QUANTIZED"):
        assert text in result.output
    data = json.loads(runner.invoke(app, ["inspect", "--steps", "--json", str(path)]).output)
    assert data["profile"] == "fp8-kv" and len(data["steps"]) == 5


def test_bad_bundles_exit_2(tmp_path):
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"not a tarball")
    for path, message in ((tmp_path / "missing.tar.gz", "does not exist"), (bad, "cannot read")):
        with pytest.raises(SoarpackError, match=message):
            platform_steps(path)
        result = runner.invoke(app, ["inspect", "--steps", str(path)])
        assert result.exit_code == 2 and "Traceback" not in result.output


def test_steps_view_does_not_run_the_bundle(fp8_bundle, tmp_path, monkeypatch):
    # Reading never spawns a process: the scripts are parsed, not executed.
    calls = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: calls.append(a) or (_ for _ in ()).throw(AssertionError))
    platform_steps(fp8_bundle[0])
    assert calls == []
