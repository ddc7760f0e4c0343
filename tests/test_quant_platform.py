"""The platform's configuration, reproduced: the bundle as `soarpack build` ships it (its calibration row count and
length limits), quantized through preprocess_model.py. Held-out rows must be disjoint from calibration rows, and
the log must report the counts that really ran.

The run itself calibrates on a few short rows, asked the way `soarpack check` shrinks a rehearsal: extra flags in
SOARPACK_QUANTIZE_EXTRA, which preprocess_model.py appends to quantize's command line (the platform never sets
it). 256 rows of 2,048 tokens take over 20 minutes on a loaded 2-core machine; what is proven does not need them:
the shipped file still holds the default rows, and the log must say the asked count ran, from that file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from soarpack.bundle import layout
from soarpack.bundle.build import build_bundle
from soarpack.bundle.tarpack import safe_extract
from soarpack.quant.options import CALIBRATION_DEFAULTS, HELD_OUT_ROWS

pytestmark = [pytest.mark.slow, pytest.mark.gptq]


def _rows(root, names):
    return [json.loads(line) for name in names for line in (root / name).read_text().splitlines() if line.strip()]


def test_platform_run_holds_out_rows_that_never_calibrate(tmp_path, tiny_model_dir):
    bundle = build_bundle(tmp_path / "b.tar.gz", wheels=False)
    root = safe_extract(bundle.path, tmp_path / "bundle")
    quant = bundle.manifest["quantize"]
    calib, held = _rows(root, quant["calib"]), _rows(root, quant["held_out"])
    assert (len(calib), len(held)) == (CALIBRATION_DEFAULTS.rows, HELD_OUT_ROWS)
    assert not {r["question"] for r in calib} & {r["question"] for r in held}

    asked, max_len = 8, 64  # passed as the platform passes extra arguments (preprocess_model.py)
    env = {**os.environ, "PYTHONPATH": str(root / layout.SRC_DIR),
           "SOARPACK_QUANTIZE_EXTRA": f"--device cpu --rows {asked} --max-len {max_len}"}
    out = tmp_path / "quantized"
    res = subprocess.run([sys.executable, str(root / layout.PREPROCESS), "--input", str(tiny_model_dir),
                          "--output", str(out)], env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # the platform tees this output: quantize's progress is in it as plain lines, as the run goes
    said = [line for line in res.stdout.splitlines() if line.startswith("quantize: ")]
    assert said[0] == "quantize: check ..." and said[-1].startswith("quantize: verify done in "), said
    assert any(line.startswith("quantize: gptq layer 1/4 started after ") for line in said), said
    log = (root / "logs" / "quantize.log").read_text()
    shipped_rows = CALIBRATION_DEFAULTS.rows
    # the counts that ran (the asked 8), of the file the bundle ships (its 256 rows), said as such
    assert (f"calibration: {asked} rows used of the {asked} asked (by --rows), from builtin.jsonl "
            f"({shipped_rows} rows)") in log, log
    assert f"{HELD_OUT_ROWS} held-out rows (files), disjoint" in log, log
    report = json.loads((out / "soarpack_quant_report.json").read_text())
    assert (report["rows"], report["held_out_rows"]) == (asked, HELD_OUT_ROWS)
    assert report["calibration"]["max_len"] == max_len
    assert report["calibration"]["set_by"]["rows"] == report["calibration"]["set_by"]["max_len"] == "cli"
    # the bundle ran the recipe it ships: its [calibration] settings the extra flags leave alone, else the defaults
    from soarpack.recipe.model import load_recipe

    shipped = load_recipe(quant["recipe"]).calibration
    assert report["recipe"] == quant["recipe_name"]
    assert report["calibration"]["set_by"]["seed"] == ("recipe" if shipped and shipped.seed is not None else "default")
