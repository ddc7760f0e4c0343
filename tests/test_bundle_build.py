"""soarpack build: the tree, MANIFEST.json, determinism and every refusal (oversize, credentials, bad flags)."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.bundle import layout
from soarpack.bundle.build import BundleTooLargeError, build_bundle
from soarpack.placement.content import sha256_file
from soarpack.bundle.secrets import CredentialError, scan_tree
from soarpack.bundle.tarpack import safe_extract
from soarpack.bundle.wheels import make_pure_wheel
from soarpack.cli import app
from soarpack.errors import ConfigError, InputDataError
from soarpack.recipe.profile import DEFAULT_PROFILE, load_profile

QUIET = dict(calib_rows=8)


def _build(tmp_path: Path, name: str = "b.tar.gz", **kw) -> Path:
    kw.setdefault("wheels", False)
    return build_bundle(tmp_path / name, **{**QUIET, **kw}).path


def _extract(tar: Path, dest: Path) -> Path:
    return safe_extract(tar, dest)


def test_two_builds_from_the_same_inputs_are_byte_identical(tmp_path):
    wheels = tmp_path / "wh"
    make_pure_wheel(wheels, "soarpack-ci-probe", "1.0", {"soarpack_ci_probe.py": "VALUE = 42\n"})
    one = _build(tmp_path, "one.tar.gz", wheels=True, wheel_dir=wheels)
    two = _build(tmp_path, "two.tar.gz", wheels=True, wheel_dir=wheels)
    assert one.read_bytes() == two.read_bytes()
    three = _build(tmp_path, "three.tar.gz", wheels=True, wheel_dir=wheels, calib_rows=9)
    assert three.read_bytes() != one.read_bytes()


def test_tree_and_manifest(tmp_path):
    tar = _build(tmp_path)
    root = _extract(tar, tmp_path / "x")
    for name in layout.REQUIRED:
        assert (root / name).is_file(), name
    manifest = json.loads((root / "MANIFEST.json").read_text())
    prof = load_profile(DEFAULT_PROFILE)
    assert manifest["soarpack_version"]
    assert manifest["profile"]["name"] == prof.name and manifest["profile"]["args"] == prof.args
    assert manifest["quantize"]["recipe"] == prof.recipe
    assert manifest["quantize"]["calib"] == ["calib/builtin.jsonl"]
    assert len((root / "calib" / "builtin.jsonl").read_text().splitlines()) == 8
    assert manifest["sglang"]["mode"] == ("platform" if prof.patches else "none")
    assert manifest["wheels"] == {"source": "none", "files": []}
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} - {"MANIFEST.json"}
    assert set(manifest["files"]) == on_disk
    for rel, entry in manifest["files"].items():
        assert entry == {"sha256": sha256_file(root / rel), "size": (root / rel).stat().st_size}
    assert (root / "src" / "soarpack" / "bundle" / "build.py").is_file()
    assert not list(root.rglob("__pycache__"))
    with tarfile.open(tar) as t:
        modes = {m.name: m.mode for m in t.getmembers()}
    assert modes["prepare_env.sh"] == 0o755 and modes["prepare_model.sh"] == 0o755


def test_bundle_env_gives_the_profile_args_back_through_the_shell(tmp_path):
    prof = load_profile(DEFAULT_PROFILE)
    root = _extract(_build(tmp_path), tmp_path / "x")
    out = subprocess.run(["bash", "-c", '. "$1"; printf "%s\\n" "$SOARPACK_BUNDLE_SERVER_ARGS" "$SOARPACK_BUNDLE_PROFILE"', "_",
                          str(root / "bundle.env")], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [prof.args_string(), prof.name]


def test_user_recipe_file_and_calibration_are_shipped(tmp_path):
    from soarpack.recipe.files import RECIPES_DIR

    recipe = tmp_path / "mine.toml"
    recipe.write_text((RECIPES_DIR / "w4-full.toml").read_text())
    calib = tmp_path / "calib.jsonl"
    calib.write_text(json.dumps({"question": "What is 2+2?"}) + "\n")
    root = _extract(_build(tmp_path, recipe=recipe, calib=[calib]), tmp_path / "x")
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert manifest["quantize"]["recipe"] == "recipe.toml"
    assert (root / "recipe.toml").read_text() == recipe.read_text()
    assert manifest["quantize"]["calib"] == ["calib/00-calib.jsonl"]
    assert (root / "calib" / "00-calib.jsonl").read_bytes() == calib.read_bytes()


def test_oversize_is_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(BundleTooLargeError, match="over the platform"):
        build_bundle(tmp_path / "big.tar.gz", wheels=False, max_bytes=10_000, **QUIET)
    assert not list(tmp_path.iterdir())


def test_near_the_limit_warns(tmp_path):
    result = build_bundle(tmp_path / "b.tar.gz", wheels=False, warn_bytes=10_000, **QUIET)
    assert any("close to the" in w for w in result.warnings)


@pytest.mark.parametrize("filename, content, what", [
    ("notes.jsonl", '{"question": "key hf_' + "a" * 34 + '"}\n', "Hugging Face token"),
    ("data.jsonl", '{"text": "-----BEGIN OPENSSH PRIVATE KEY-----\\nabc"}\n', "private key"),
    ("gh.jsonl", '{"text": "ghp_' + "B" * 36 + '"}\n', "GitHub token"),
])
def test_credential_content_is_refused_with_the_file_named(tmp_path, filename, content, what):
    calib = tmp_path / filename
    calib.write_text(content)
    with pytest.raises(CredentialError, match=what) as exc:
        build_bundle(tmp_path / "out" / "b.tar.gz", wheels=False, calib=[calib], **QUIET)
    assert f"calib/00-{filename}" in str(exc.value)
    assert not (tmp_path / "out" / "b.tar.gz").exists()


@pytest.mark.parametrize("rel", [".netrc", "sub/.git/config", ".ssh/id_ed25519", "keys/server.pem", ".pypirc"])
def test_credential_files_are_refused_by_name(tmp_path, rel):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("harmless words\n")
    (tmp_path / "ok.txt").write_text("fine\n")
    with pytest.raises(CredentialError) as exc:
        scan_tree(tmp_path)
    assert rel.split("/")[0] in str(exc.value)


def test_clean_tree_and_soarpack_source_pass_the_scan(tmp_path):
    scan_tree(layout.PACKAGE_DIR)  # our own source (regexes included) must not trip the scanner
    (tmp_path / "README.md").write_text("tokens look like hf_xxx; keys begin with BEGIN\n")
    scan_tree(tmp_path)


def test_broken_calibration_stops_with_file_and_line(tmp_path):
    calib = tmp_path / "c.jsonl"
    calib.write_text('{"question": "ok"}\n{broken\n')
    with pytest.raises(InputDataError, match="c.jsonl:2"):
        build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[calib], **QUIET)


def test_profile_with_a_lint_error_is_refused(tmp_path):
    prof = tmp_path / "bad.toml"
    prof.write_text('recipe = "w4-mlp"\n[serve]\nargs = ["--attention-backend", "minicpm_flashinfer", "--disable-cuda-graph"]\n')
    with pytest.raises(ConfigError, match="cuda-graph-disabled"):
        build_bundle(tmp_path / "b.tar.gz", profile=str(prof), wheels=False, **QUIET)


runner = CliRunner()


@pytest.mark.parametrize("args, message", [
    (["build", "--bogus-flag"], "No such option"),
    (["build", "--profile", "no-such-profile"], "unknown serving profile"),
    (["build", "--sglang-src", "/nonexistent/fork"], "not a directory"),
    (["build", "--calib", "/nonexistent/c.jsonl"], "does not exist"),
    (["build", "--no-wheels", "--wheel-dir", "."], "contradict"),
])
def test_bad_flags_exit_2_with_the_cause(tmp_path, args, message):
    res = runner.invoke(app, [*args, "-o", str(tmp_path / "b.tar.gz")])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert not (tmp_path / "b.tar.gz").exists()


def test_cli_build_json(tmp_path):
    res = runner.invoke(app, ["build", "--no-wheels", "-o", str(tmp_path / "b.tar.gz"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["path"] == str(tmp_path / "b.tar.gz") and data["size"] == (tmp_path / "b.tar.gz").stat().st_size
    assert any("--no-wheels" in w for w in data["warnings"])
