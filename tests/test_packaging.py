"""A wheel of soarpack carries what an installed soarpack needs: recipes, SGLang patch set, wheel lock, entry scripts."""

import subprocess
import sys
import zipfile

import pytest


@pytest.mark.slow
def test_wheel_ships_recipes_patches_and_lock(tmp_path):
    from pathlib import Path

    from importlib.metadata import PackageNotFoundError, version

    try:
        setuptools_major = int(version("setuptools").split(".")[0])
    except PackageNotFoundError:
        setuptools_major = 0
    if setuptools_major < 68:  # pyproject.toml's build requirement; --no-build-isolation uses what is installed
        pytest.skip("this environment's setuptools is older than the build requirement (>=68)")
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(root)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("soarpack-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    patches = sorted(p.name for p in (root / "sglang").glob("*.patch"))
    assert patches and all(f"soarpack/sglang_patches/{p}" in names for p in patches)
    assert "soarpack/sglang_patches/fork-hashes.json" in names
    assert {"soarpack/recipes/w4-mlp.toml", "soarpack/profiles/safe.toml", "soarpack/bundle/platform-lock.json",
            "soarpack/diagnosis/catalogue.toml"} <= names
    for script in ("prepare_env.sh", "prepare_model.sh", "preprocess_model.py"):
        assert f"soarpack/bundle/entry/{script}" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)
