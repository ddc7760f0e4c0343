"""The default bundle on the platform image's own Python stack: CPython 3.10, torch 2.9.1, torchao 0.9.0,
transformers 4.57.1 (the fork's pins), with the bundle's overlay installed over it exactly as prepare_env.sh does.

This is the test that the torchao bug (transformers 5 importing a bundled torchao 0.18 that needs a newer torch)
would have failed. It builds the real default bundle with its real wheels (downloaded once into the cache) and
the image stand-in (~4 GB, cached); under CI=true a missing Python 3.10 is a failure, never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from soarpack.bundle.build import build_bundle
from soarpack.bundle.check import source_prepare_env
from soarpack.bundle.imagestack import IMAGE_PINS, clean_env, ensure_image_stack
from soarpack.bundle.tarpack import safe_extract
from soarpack.bundle.wheels import find_python310, load_lock
from soarpack.sala.tiny import make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.image_stack]

OVERLAY_PROBE = (
    "import json, sys, torch, transformers, transformers.modeling_utils, gptqmodel, soarpack.quant, soarpack.quant.run\n"
    "print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__,\n"
    "                  'transformers': transformers.__version__, 'gptqmodel': gptqmodel.__version__,\n"
    "                  'soarpack': soarpack.__file__}))\n"
)


def _require_python310():
    if find_python310() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no CPython 3.10 here: the platform's stack cannot be rehearsed")
        pytest.skip("no CPython 3.10 here (set SOARPACK_PYTHON310): the platform's stack is not rehearsed")


@pytest.fixture(scope="module")
def image():
    _require_python310()
    return ensure_image_stack(log=print)


@pytest.fixture(scope="module")
def prepared(image, tmp_path_factory):
    """The default bundle, extracted, with prepare_env.sh sourced over the image stand-in."""
    work = tmp_path_factory.mktemp("image-stack")
    bundle = build_bundle(work / "soarpack-safe.tar.gz", log=print).path
    root = safe_extract(bundle, work / "bundle")
    env = clean_env()
    env.update(SOARPACK_IMAGE_PYTHON=str(image.python), SOARPACK_SKIP_SGLANG="1",
               PATH=f"{image.python.parent}{os.pathsep}{env.get('PATH', '')}")
    values = source_prepare_env(root, env, cwd=work)
    assert values.get("ALIVE") == "1", values["_stderr"]
    return work, root, env, values


def test_image_stand_in_runs_the_forks_pins(image):
    pins = dict(p.split("==") for p in IMAGE_PINS)
    assert image.versions["python"].startswith("3.10.")
    assert image.versions["torch"].split("+")[0] == pins["torch"]
    assert image.versions["transformers"] == pins["transformers"]


def test_the_lock_ships_no_torch_and_no_torchao():
    names = {w.name for w in load_lock()}
    assert not names & {"torch", "torchao"}


def test_overlay_imports_the_quantization_stack_on_the_images_torch(prepared):
    work, root, env, values = prepared
    overlay = values["PY"]
    assert "!!!" not in values["_stdout"], values["_stdout"][-2000:]
    proc = subprocess.run([overlay, "-c", OVERLAY_PROBE], capture_output=True, text=True, env=env, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["python"].startswith("3.10.")
    assert got["torch"].split("+")[0] == "2.9.1"  # the image's, through the overlay's .pth
    assert got["transformers"] == "5.20.2"  # the bundle's, shadowing the image's 4.57.1
    assert got["gptqmodel"].startswith("7.6.0")
    assert got["soarpack"].startswith(str(root / "src"))


def test_prepare_model_quantizes_a_tiny_model_on_the_image_stack(prepared):
    work, root, env, values = prepared
    tiny = make_tiny_model(work / "tiny", num_layers=4)
    out = work / "quantized"
    penv = dict(env, SOARPACK_PYTHON=values["PY"], GPTQMODEL_CPU_WORKERS="2",
                SOARPACK_QUANTIZE_EXTRA="--rows 16 --max-len 128 --device cpu")
    proc = subprocess.run(["bash", str(root / "prepare_model.sh"), "--input", str(tiny), "--output", str(out)],
                          capture_output=True, text=True, env=penv, cwd=work)
    causes = [ln for ln in proc.stdout.splitlines() if "error:" in ln]
    assert proc.returncode == 0, causes[-1:] or proc.stdout[-3000:]
    assert json.loads((out / "config.json").read_text())["quantization_config"]["bits"] == 4
    log = (root / "logs" / "prepare_model.log").read_text()
    assert "phase quantize: ok" in log and "phase verify: ok" in log
