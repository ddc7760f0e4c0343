"""`soarpack build --rows N` sets the calibration rows the platform's quantize asks for, without editing a recipe:
the MANIFEST records it (quantize.extra_args and quantize.calibration, asked by "cli"), preprocess_model.py passes
it to quantize, and build, inspect and the risks say it was asked by build --rows."""

import importlib.util
import json
import tarfile
from pathlib import Path

import typer
from typer.testing import CliRunner

from soarpack.bundle.build import build_bundle
from soarpack.bundle.tarpack import safe_extract
from soarpack.cli import app

def _preprocess_module(bundle, dest):
    """The bundle's own preprocess_model.py, extracted (it finds the files the MANIFEST names beside itself)."""
    root = Path(safe_extract(bundle, dest))
    spec = importlib.util.spec_from_file_location(f"bundle_preprocess_{dest.name}", root / "preprocess_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _quantize_rows(argv):
    """The --rows that `soarpack quantize` parses from an argv (`... -m soarpack quantize IN OUT ...`)."""
    group = typer.main.get_command(app)
    quantize = group.get_command(group.make_context("soarpack", ["quantize", "--help"], resilient_parsing=True),
                                 "quantize")
    start = argv.index("quantize") + 1
    return quantize.make_context("quantize", list(argv[start:])).params["rows"]


def test_build_rows_reaches_the_platforms_quantize_and_the_manifest(tmp_path):
    out = tmp_path / "b.tar.gz"
    result = CliRunner().invoke(app, ["build", "--no-wheels", "--rows", "64", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "calibration: 64 rows shipped of the 64 asked (by build --rows), from the built-in synthetic prompts" \
        in " ".join(result.stderr.split())
    with tarfile.open(out) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    quant = manifest["quantize"]
    assert quant["extra_args"] == ["--rows", "64"]
    assert (quant["calibration"]["rows_asked"], quant["calibration"]["asked_by"]) == (64, "cli")
    assert quant["calibration"]["sources"][0]["rows"] == 64
    argv = _preprocess_module(out, tmp_path / "x").quantize_command(manifest, tmp_path / "in", tmp_path / "out", False)
    assert _quantize_rows(argv) == 64
    inspected = CliRunner().invoke(app, ["inspect", str(out)])
    assert "of the 64 asked (by build --rows)" in inspected.stdout


def test_without_rows_nothing_is_added_and_the_default_asks(tmp_path):
    built = build_bundle(tmp_path / "b.tar.gz", wheels=False, calib_rows=8)
    assert built.manifest["quantize"]["extra_args"] == []
    assert built.manifest["quantize"]["calibration"]["asked_by"] == "default"
    argv = _preprocess_module(built.path, tmp_path / "x").quantize_command(built.manifest, tmp_path / "in",
                                                                           tmp_path / "out", False)
    assert _quantize_rows(argv) is None  # quantize resolves the recipe's, else the default


def test_a_short_calibration_file_is_measured_against_build_rows(tmp_path):
    calib = tmp_path / "mine.jsonl"
    calib.write_text("".join(json.dumps({"task": "qa", "question": f"question {i} about the text", "gold": "x"})
                             + "\n" for i in range(12)))
    built = build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[calib], rows=32)
    short = [r for r in built.risks if r.name == "calib-short"]
    assert short and "against the 32 build --rows asks for" in short[0].message


def test_build_rows_refuses_zero(tmp_path):
    result = CliRunner().invoke(app, ["build", "--no-wheels", "-n", "0", "-o", str(tmp_path / "b.tar.gz")])
    assert result.exit_code == 2 and "Invalid value for '-n' / '--rows'" in result.output and not (tmp_path / "b.tar.gz").exists()
