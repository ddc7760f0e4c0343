"""The MANIFEST as a typed record with one reader: earlier versions' MANIFESTs read or refused in one line, one
identity field that the name, inspect, eval and bench show, and MANIFEST, bundle.env and check derived from one
record and held against each other."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.bundle import layout
from soarpack.bundle.build import build_bundle
from soarpack.rehearse.check import check_bundle
from soarpack.bundle.manifest import (MANIFEST_NAME, Manifest, parse_manifest, read_manifest, render_bundle_env)
from soarpack.bundle.summary import inspect_bundle
from soarpack.bundle.tarpack import safe_extract, write_tarball
from soarpack.cli import app
from soarpack.errors import SoarpackError
from soarpack.placement.content import sha256_file

ROOT = Path(__file__).resolve().parent.parent
QUIET = dict(wheels=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("manifest")
    return build_bundle(tmp / "b.tar.gz", **QUIET)


def _unpacked(built, tmp_path) -> Path:
    return safe_extract(built.path, tmp_path / "x")


def _repack(root: Path, out: Path, edit_manifest=None, edit_env=None) -> Path:
    data = json.loads((root / MANIFEST_NAME).read_text())
    if edit_env is not None:
        env = root / layout.BUNDLE_ENV
        env.write_text(edit_env(env.read_text()))
        data["files"][layout.BUNDLE_ENV] = {"sha256": sha256_file(env), "size": env.stat().st_size}  # re-hashed
    if edit_manifest is not None:
        edit_manifest(data)
    (root / MANIFEST_NAME).write_text(json.dumps(data, indent=2))
    return write_tarball(root, out)


def _structure(report) -> str:
    step = next(s for s in report.steps if s.name == "structure")
    return f"{step.status}: {step.detail}"


# -- one reader --------------------------------------------------------------------------------------------------


def test_a_manifest_an_earlier_soarpack_wrote_still_reads(built):
    old = json.loads(json.dumps(built.manifest))
    del old["quantize"]["held_out"]  # before held-out files
    old["soarpack_version"] = "0.0.9"
    m = parse_manifest(old, "old.tar.gz")
    assert m.quantize.held_out == [] and m.as_json() == old  # read as written, nothing added
    assert m.id != parse_manifest(built.manifest, "new").id


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(format=2), "MANIFEST.json format 2 is not one this soarpack"),
    (lambda d: d.pop("profile"), "MANIFEST.json profile = missing"),
    (lambda d: d["quantize"].update(calib="calib/x.jsonl"), "MANIFEST.json quantize [calib] = 'calib/x.jsonl'"),
    (lambda d: d.update(surprise=1), "MANIFEST.json surprise = 1"),
])
def test_a_manifest_it_cannot_read_is_refused_in_one_line(built, edit, message):
    data = json.loads(json.dumps(built.manifest))
    edit(data)
    with pytest.raises(SoarpackError) as err:
        parse_manifest(data, "b.tar.gz")
    assert message in err.value.message and "\n" not in err.value.message
    assert err.value.hint


def test_inspect_and_check_refuse_a_malformed_manifest_in_one_line(built, tmp_path):
    root = _unpacked(built, tmp_path)
    bad = _repack(root, tmp_path / "bad.tar.gz", edit_manifest=lambda d: d.pop("wheels"))
    res = CliRunner().invoke(app, ["inspect", str(bad)])
    assert res.exit_code == 2 and "MANIFEST.json wheels = missing" in res.output and "Traceback" not in res.output
    assert _structure(check_bundle(bad, rehearse=False)).startswith("fail: ")


# -- one identity ------------------------------------------------------------------------------------------------


def test_the_bundle_id_is_one_field_the_name_inspect_eval_and_bench_show(built, tmp_path):
    from soarpack.measure.provenance import measured

    m = read_manifest(_unpacked(built, tmp_path))
    assert built.id == m.id
    summary = inspect_bundle(built.path)
    assert summary["id"] == m.id and "content_sha256" not in summary
    assert measured("x", summary, None)["bundle"]["id"] == m.id  # what eval and bench record
    text = CliRunner().invoke(app, ["inspect", str(built.path)]).stdout
    assert f"id           {m.id}" in text


def test_the_default_name_carries_the_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = build_bundle(None, **QUIET)
    assert result.path.name.endswith(f"-{result.id[:8]}.tar.gz")
    assert inspect_bundle(result.path)["id"] == result.id


# -- one record: MANIFEST, bundle.env and check's lines ------------------------------------------------------------


def test_bundle_env_is_rendered_from_the_manifest(built, tmp_path):
    root = _unpacked(built, tmp_path)
    assert (root / layout.BUNDLE_ENV).read_text() == render_bundle_env(read_manifest(root))
    report = check_bundle(built.path, rehearse=False)
    assert _structure(report).startswith("pass: ") and f"recipe {read_manifest(root).quantize.recipe_name}" in _structure(report)


def test_extra_args_that_contradict_the_manifests_recipe_fail_check(built, tmp_path):
    root = _unpacked(built, tmp_path)
    bad = _repack(root, tmp_path / "bad.tar.gz",
                  edit_manifest=lambda d: d["quantize"].update(extra_args=["--recipe", "w4-full"]))
    line = _structure(check_bundle(bad, rehearse=False))
    assert line.startswith("fail: ") and "quantize.extra_args sets --recipe w4-full" in line
    assert "quantize.recipe says 'w4-mlp'" in line


def test_a_bundle_env_whose_args_disagree_with_the_manifest_fails_check(built, tmp_path):
    root = _unpacked(built, tmp_path)
    bad = _repack(root, tmp_path / "bad.tar.gz",
                  edit_env=lambda text: text.replace("--disable-radix-cache", "--disable-cuda-graph"))
    line = _structure(check_bundle(bad, rehearse=False))
    assert line.startswith("fail: ") and "bundle.env SOARPACK_BUNDLE_SERVER_ARGS=" in line
    assert "--disable-cuda-graph" in line and "but MANIFEST.json says" in line


# -- what cannot import soarpack, held equal -----------------------------------------------------------------------


def test_preprocess_model_reads_the_manifest_as_the_model_does(built, tmp_path):
    spec = importlib.util.spec_from_file_location("preprocess_model", ROOT / "preprocess_model.py")
    pre = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pre)
    root = _unpacked(built, tmp_path)
    data = json.loads(json.dumps(built.manifest))
    data["quantize"]["extra_args"] = ["--rows", "8"]
    m: Manifest = parse_manifest(data, "b")
    pre.BUNDLE = root
    cmd = pre.quantize_command(data, Path("IN"), Path("OUT"), False)
    assert cmd[cmd.index("--recipe") + 1] == str(m.recipe_ref(root))
    given = [cmd[i + 1] for i, tok in enumerate(cmd) if tok in ("--calib", "--held-out")]
    assert given == [str(root / n) for n in m.quantize.calib + m.quantize.held_out]
    assert cmd[cmd.index("--rows"):cmd.index("--rows") + 2] == m.quantize.extra_args
