"""The platform's entry scripts on their own: prepare_env.sh is safe to source, prepare_model.sh and
preprocess_model.py validate their arguments and fail with one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from soarpack.bundle import layout

SCRIPTS = {name: layout.script_path(name) for name in layout.SCRIPTS}


def _bare_bundle(tmp_path: Path, manifest: dict | None = None) -> Path:
    root = tmp_path / "bundle"
    root.mkdir()
    for name, path in SCRIPTS.items():
        shutil.copy(path, root / name)
    (root / "MANIFEST.json").write_text(json.dumps(manifest or {"quantize": {"recipe": "w4-mlp", "calib": []}, "files": {}}))
    return root


def _bash(script: str, *args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "--noprofile", "--norc", "-c", script, "test", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=120)


def test_scripts_pass_bash_n():
    for name in (layout.PREPARE_ENV, layout.PREPARE_MODEL):
        assert subprocess.run(["bash", "-n", str(SCRIPTS[name])]).returncode == 0


@pytest.mark.parametrize("caller_opts", ["", "set -e", "set -eu", "set -o pipefail"])
def test_sourcing_a_broken_bundle_neither_exits_nor_changes_shell_options(tmp_path, caller_opts):
    # No bundle.env, no python: every step fails, and the caller's shell must still be running, options intact.
    root = _bare_bundle(tmp_path)
    script = (f'{caller_opts}\nbefore="$-"\nsource "$1/prepare_env.sh"\necho "rc=$?"\nafter="$-"\n'
              'if [ "$after" = "$before" ]; then echo opts_same=yes; else echo "opts $before -> $after"; fi\necho alive\n')
    res = _bash(script, str(root), env={"SOARPACK_IMAGE_PYTHON": "/nonexistent/python", "SGLANG_SERVER_ARGS": "--platform-default"},
                cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "alive" in lines and "opts_same=yes" in lines and "rc=0" in lines
    assert "!!!" in res.stdout  # the failure is loud
    assert (root / "logs" / "prepare_env.log").is_file()


def test_sourcing_leaves_no_helper_functions_or_temporaries(tmp_path):
    root = _bare_bundle(tmp_path)
    res = _bash('source "$1/prepare_env.sh" >/dev/null; declare -F | grep -c _soarpack_ ; echo "log=${_SP_LOG:-unset}"', str(root),
                env={"SOARPACK_IMAGE_PYTHON": "/nonexistent/python"})
    assert res.stdout.splitlines() == ["0", "log=unset"]


def test_server_args_replace_the_platform_default_and_it_is_remembered(tmp_path):
    root = _bare_bundle(tmp_path)
    (root / "bundle.env").write_text("SOARPACK_BUNDLE_SERVER_ARGS='--quantization gptq_marlin --dtype bfloat16'\n"
                                     "SOARPACK_BUNDLE_SGLANG=none\n")
    res = _bash('source "$1/prepare_env.sh" >/dev/null; echo "$SGLANG_SERVER_ARGS"; echo "$SOARPACK_PLATFORM_SGLANG_SERVER_ARGS"',
                str(root), env={"SOARPACK_IMAGE_PYTHON": "/nonexistent/python", "SGLANG_SERVER_ARGS": "--dense-as-sparse"})
    assert res.stdout.splitlines() == ["--quantization gptq_marlin --dtype bfloat16", "--dense-as-sparse"]


def test_missing_patched_fork_exports_the_fallback_args_loudly(tmp_path):
    root = _bare_bundle(tmp_path)
    (root / "bundle.env").write_text("SOARPACK_BUNDLE_SERVER_ARGS='--kv-cache-dtype fp8_e5m2'\nSOARPACK_BUNDLE_FALLBACK_ARGS='--safe'\n"
                                     "SOARPACK_BUNDLE_SGLANG=platform\nSOARPACK_BUNDLE_PATCHES='fp8-kv-query'\n")
    res = _bash('source "$1/prepare_env.sh"; echo "ARGS=$SGLANG_SERVER_ARGS"; echo "STATE=$SOARPACK_SGLANG_STATE"', str(root),
                env={"SOARPACK_IMAGE_PYTHON": "/nonexistent/python", "SOARPACK_SGLANG_FORK": str(tmp_path / "no-fork")})
    assert "ARGS=--safe" in res.stdout.splitlines() and "STATE=fallback" in res.stdout.splitlines()
    assert "FALLBACK" in res.stdout and "not at" in res.stdout


def _fake_sala(path: Path, **config) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "minicpm_sala", **config}))
    (path / "model.safetensors").write_bytes(b"")
    return path


def _preprocess(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(root / layout.PREPROCESS), *args], capture_output=True, text=True, timeout=300)


def _one_line_cause(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines, res.stdout
    return lines[-1]


def test_preprocess_requires_input_and_output(tmp_path):
    root = _bare_bundle(tmp_path)
    res = _preprocess(root, "--input", str(tmp_path))
    assert res.returncode == 2 and "--output" in res.stderr


@pytest.mark.parametrize("case, expect", [
    ("missing-input", "is not a directory"),
    ("not-sala", "not a MiniCPM-SALA checkpoint"),
    ("quantized", "already quantized"),
    ("no-weights", "no *.safetensors"),
    ("same", "same directory"),
    ("inside", "lies inside --input"),
    ("contains", "contains --input"),
    ("file-output", "not a directory"),
])
def test_preprocess_refuses_bad_paths_with_one_line(tmp_path, case, expect):
    root = _bare_bundle(tmp_path)
    inp, out = tmp_path / "models" / "in", tmp_path / "out"
    if case == "missing-input":
        pass
    elif case == "not-sala":
        _fake_sala(inp, model_type="llama")
    elif case == "quantized":
        _fake_sala(inp, quantization_config={"bits": 4})
    elif case == "no-weights":
        _fake_sala(inp)
        (inp / "model.safetensors").unlink()
    else:
        _fake_sala(inp)
        out = {"same": inp, "inside": inp / "q", "contains": tmp_path / "models", "file-output": tmp_path / "file"}[case]
        if case == "file-output":
            out.write_text("x")
    res = _preprocess(root, "--input", str(inp), "--output", str(out))
    assert res.returncode == 1
    cause = _one_line_cause(res)
    assert cause.startswith("preprocess_model: error:") and expect in cause, cause


def test_preprocess_refuses_a_manifest_calibration_file_that_is_missing(tmp_path):
    root = _bare_bundle(tmp_path, {"quantize": {"recipe": "w4-mlp", "calib": ["calib/gone.jsonl"]}, "files": {}})
    res = _preprocess(root, "--input", str(_fake_sala(tmp_path / "in")), "--output", str(tmp_path / "out"))
    assert res.returncode == 1 and "calib/gone.jsonl" in _one_line_cause(res)


def test_prepare_model_without_a_venv_fails_with_one_line(tmp_path):
    root = _bare_bundle(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "SOARPACK_PYTHON"}
    res = subprocess.run(["bash", str(root / layout.PREPARE_MODEL), "--input", "x", "--output", "y"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert res.returncode == 1
    assert "prepare_model.sh: error: the quantization venv" in res.stderr
    assert (root / "logs" / "prepare_model.log").is_file()


def test_prepare_model_passes_exit_status_and_logs(tmp_path):
    root = _bare_bundle(tmp_path)
    res = subprocess.run(["bash", str(root / layout.PREPARE_MODEL), "--input", str(tmp_path / "nope"), "--output", str(tmp_path / "o")],
                         capture_output=True, text=True, env={**os.environ, "SOARPACK_PYTHON": sys.executable}, timeout=120)
    assert res.returncode == 1
    log = (root / "logs" / "prepare_model.log").read_text()
    assert "preprocess_model: error: --input" in log and "exit 1" in log


def test_the_image_python_is_the_one_with_torch(tmp_path):
    root = _bare_bundle(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, code in (("python3", 1), ("python", 0)):  # only `python` answers "torch is here"
        (bin_dir / name).write_text(f"#!/bin/sh\nexit {code}\n")
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SOARPACK_IMAGE_PYTHON"}
    env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
    res = subprocess.run(["bash", "--noprofile", "--norc", "-c", 'source "$1/prepare_env.sh"; echo alive', "t", str(root)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert "alive" in res.stdout
    assert f"image python: {bin_dir / 'python'}" in res.stdout
