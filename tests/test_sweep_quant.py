"""Rows of the reliability sweep (docs/reliability-sweep-2026-11-30.md) that the typed quantize schema fixes: each
bad input is refused with exit 2 and one line naming it, without a traceback, before any calibration or load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if calibration or model loading starts."""
    import soarpack.quant.calib as calib
    import soarpack.sala.checkpoint as checkpoint

    def work_started(*a, **k):
        raise AssertionError("work started before the refusal")

    monkeypatch.setattr(calib, "build_calibration", work_started)
    monkeypatch.setattr(checkpoint, "load_model", work_started)


def refused(args, *needles):
    res = CliRunner().invoke(app, ["quantize", *map(str, args)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    for needle in needles:
        assert needle in text, (needle, text)
    return text


def recipe_file(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text('[quant]\nname = "r"\nbits = 4\ngroup_size = 128\n' + body)
    return path


def test_row_010_dense_len_not_an_integer(tiny_model_dir, tmp_path, no_work):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg.setdefault("sparse_config", {})["dense_len"] = "abc"
    (model / "config.json").write_text(json.dumps(cfg))
    refused([model, tmp_path / "q"], "dense_len", "'abc'")


def test_row_014_rows_zero(tiny_model_dir, tmp_path, no_work):
    refused([tiny_model_dir, tmp_path / "q", "--rows", "0"], "--rows 0")


def test_row_015_rows_negative_named_as_given(tiny_model_dir, tmp_path, no_work):
    text = refused([tiny_model_dir, tmp_path / "q", "--rows", "-5"], "--rows -5")
    assert "-1" not in text


@pytest.mark.parametrize("batch", ["0", "-3"])
def test_row_017_018_batch_zero_or_negative(tiny_model_dir, tmp_path, no_work, batch):
    refused([tiny_model_dir, tmp_path / "q", "--batch", batch], f"--batch {batch}")


def test_row_019_sanity_bound_nan(tiny_model_dir, tmp_path, no_work):
    refused([tiny_model_dir, tmp_path / "q", "--max-sanity-loss", "nan"], "--max-sanity-loss nan", "finite")


def test_row_022_recipe_name_escaping_the_recipes_folder(tiny_model_dir, tmp_path, no_work):
    evil = "../../../../../..evil"
    (tmp_path / "..evil.toml").write_text('[quant]\nname = "evil"\n')
    refused([tiny_model_dir, tmp_path / "q", "--recipe", evil], repr(evil))


def test_row_026_recipe_file_not_utf8(tiny_model_dir, tmp_path, no_work):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"[quant]\nname = \"\xff\xfe\"\n")
    refused([tiny_model_dir, tmp_path / "q", "--recipe", path], "bad.toml", "UTF-8")


@pytest.mark.parametrize("key, value", [("bits", "4.0"), ("group_size", "128.0")])
def test_row_027_bits_float_refused(tiny_model_dir, tmp_path, no_work, key, value):
    path = tmp_path / "f.toml"
    path.write_text(f'[quant]\nname = "f"\n{key} = {value}\n')
    refused([tiny_model_dir, tmp_path / "q", "--recipe", path], f"{key} = {value}")


def test_row_028_rule_matching_no_module(tiny_model_dir, tmp_path, no_work):
    path = recipe_file(tmp_path, '[[quant.rules]]\nlayers = [99, 100]\nmodules = ["mlp"]\nquantize = false\n')
    refused([tiny_model_dir, tmp_path / "q", "--recipe", path], "rule 1 matches no module", "[99, 100]")


def test_row_029_rule_first_true(tiny_model_dir, tmp_path, no_work):
    path = recipe_file(tmp_path, '[[quant.rules]]\nlayers = "lightning"\nfirst = true\nmodules = ["mlp"]\nbits = 8\n')
    refused([tiny_model_dir, tmp_path / "q", "--recipe", path], "first = True")
