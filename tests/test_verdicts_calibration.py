"""Calibration honesty: quantize and calib report the rows used against the rows asked for, and where they came
from, in the terminal, the report and the log (a 12-row file against the recipe's 256 says so)."""

import json

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.sala.tiny import make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.gptq]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m", num_layers=2)


def _rows(path, n):
    path.write_text("".join(json.dumps({"task": "qa", "question": f"Which river runs past the old mill in story {i}?",
                                        "gold": "the grey one"}) + "\n" for i in range(n)))
    return path


def test_quantize_says_12_rows_were_used_of_the_recipes_256(tiny, tmp_path):
    calib, out, log = _rows(tmp_path / "mine.jsonl", 12), tmp_path / "q", tmp_path / "q.log"
    result = CliRunner().invoke(app, ["quantize", str(tiny), str(out), "--recipe", "w4-mlp", "--calib", str(calib),
                                      "--max-len", "128", "--device", "cpu", "--no-report", "--log", str(log)],
                                env={"GPTQMODEL_CPU_WORKERS": "2"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "calibration: 12 rows used of the 256 asked (soarpack's default), from mine.jsonl (12 rows)" in text
    assert "note: calibration: 12 rows used of the 256 asked" in text and "244 fewer rows than asked" in text
    report = json.loads((out / "soarpack_quant_report.json").read_text())
    cal = report["calibration"]
    assert (cal["rows"], cal["rows_asked"], cal["asked_by"], cal["rows_used"], cal["builtin"]) == (256, 256, "default", 12, False)
    assert cal["sources"] == [{"file": "mine.jsonl", "rows": 12, "tasks": {"qa": 12}}]
    assert any("12 rows used of the 256 asked" in n for n in report["notes"])
    logged = log.read_text()
    assert "rows asked 256 (default)" in logged and "calibration: 12 rows used of the 256 asked (soarpack's default)" in logged


def test_calib_preview_says_rows_used_of_rows_asked(tiny, tmp_path):
    calib = _rows(tmp_path / "mine.jsonl", 12)
    result = CliRunner().invoke(app, ["calib", str(calib), "--model-dir", str(tiny), "--max-len", "128"])
    assert result.exit_code == 0, result.output
    assert "calibration: 12 rows used of the 256 asked (soarpack's default), from mine.jsonl (12 rows)" in result.stdout
    assert "note: calibration: 12 rows used" in result.stdout
    asked = CliRunner().invoke(app, ["calib", str(calib), "--model-dir", str(tiny), "--max-len", "128", "-n", "10",
                                     "--json"])
    summary = json.loads(asked.stdout)
    assert (summary["rows"], summary["rows_asked"], summary["asked_by"]) == (10, 10, "-n")
    builtin = CliRunner().invoke(app, ["calib", "--model-dir", str(tiny), "--max-len", "128", "-n", "5"]).stdout
    assert "5 rows used of the 5 asked (by -n), from the built-in synthetic prompts" in builtin and "note:" not in builtin
