"""Issue 27 item 2: `soarpack check` gives prepare_env.sh uv, as the platform has, when soarpack's venv has it,
although the quick start runs `.venv/bin/soarpack` without `.venv/bin` on PATH; pip otherwise, saying why."""

from __future__ import annotations

import os
from pathlib import Path

from soarpack.rehearse.installer import PIP, UV_PIP, expose, find_installer, installer_that_ran


def _exe(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_uv_beside_the_python_that_runs_soarpack_is_found_off_path(tmp_path):
    python = _exe(tmp_path / "venv" / "bin", "python")
    uv = _exe(tmp_path / "venv" / "bin", "uv")
    found = find_installer(str(python), path=str(tmp_path / "empty"))
    assert found.name == UV_PIP and found.uv == str(uv)
    assert found.why == f"uv at {uv}, beside soarpack's Python"


def test_uv_on_path_when_the_venv_has_none(tmp_path):
    python = _exe(tmp_path / "venv" / "bin", "python")
    uv = _exe(tmp_path / "tools", "uv")
    found = find_installer(str(python), path=str(tmp_path / "tools"))
    assert (found.name, found.uv, found.why) == (UV_PIP, str(uv), f"uv at {uv}, on PATH")


def test_no_uv_anywhere_is_pip_and_says_where_it_looked(tmp_path):
    python = _exe(tmp_path / "venv" / "bin", "python")
    (tmp_path / "venv" / "bin" / "uv").write_text("not executable")
    found = find_installer(str(python), path=str(tmp_path / "empty"))
    assert found.name == PIP and found.uv is None
    assert str(tmp_path / "venv" / "bin") in found.why and "on PATH" in found.why and "pip install uv" in found.why
    assert expose(found, tmp_path / "t") == [] and not (tmp_path / "t").exists()


def test_expose_puts_only_uv_on_the_path(tmp_path):
    bindir = tmp_path / "venv" / "bin"
    python = _exe(bindir, "python")
    _exe(bindir, "uv")
    entries = expose(find_installer(str(python), path=""), tmp_path / "tools")
    assert entries == [str(tmp_path / "tools")]
    assert sorted(os.listdir(entries[0])) == ["uv"]  # not the venv's python
    assert os.path.realpath(Path(entries[0]) / "uv") == os.path.realpath(bindir / "uv")


def test_the_installer_that_ran_is_read_from_prepare_env_log():
    uv_log = ("[soarpack prepare_env 12:00:00] run: uv venv --system-site-packages --python /i/python /b/venv\n"
              "[soarpack prepare_env 12:00:01] run: uv pip install --python /b/venv/bin/python --offline "
              "--no-index --no-deps /b/wheels/a.whl\n")
    pip_log = ("[soarpack prepare_env 12:00:00] run: /i/python -m venv --system-site-packages /b/venv\n"
               "[soarpack prepare_env 12:00:01] run: /b/venv/bin/python -m pip install --disable-pip-version-check "
               "--no-index /b/wheels/a.whl\n")
    assert installer_that_ran(uv_log) == UV_PIP
    assert installer_that_ran(pip_log) == PIP
    assert installer_that_ran("[soarpack prepare_env 12:00:00] SOARPACK_SKIP_WHEELS=1: 3 bundled wheels not installed\n") is None
