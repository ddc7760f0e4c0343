"""The default bundle on the platform image's own Python stack: CPython 3.10, torch 2.9.1, torchao 0.9.0,
transformers 4.57.1 (the fork's pins), through `soarpack check`, whose rehearsal sources prepare_env.sh with the
stand-in as the image's python (the overlay installed over it exactly as on the platform) and runs prepare_model.sh.

This is the test that the torchao bug (transformers 5 importing a bundled torchao 0.18 that needs a newer torch)
would have failed. It builds the real default bundle with its real wheels (downloaded once into the cache) and
the image stand-in (~4 GB, cached); under CI=true a missing Python 3.10 is a failure, never a skip.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from soarpack.bundle.build import build_bundle
from soarpack.rehearse.check import FAIL, SKIP, check_bundle
from soarpack.imagestack import IMAGE_PINS, clean_env, ensure_image_stack
from soarpack.bundle.wheels import find_python310, load_lock

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
    return ensure_image_stack(on_event=lambda e: print(e.message))


@pytest.fixture(scope="module")
def default_bundle(image, tmp_path_factory):
    """The default bundle (`soarpack build` with no options): its real wheels, from the cache or PyPI."""
    return build_bundle(tmp_path_factory.mktemp("image-stack") / "soarpack-safe.tar.gz", on_event=lambda e: print(e.message)).path


@pytest.fixture(scope="module")
def checked(default_bundle, tmp_path_factory):
    """`soarpack check` of the default bundle on the image stand-in (its default stack), kept for inspection."""
    work = tmp_path_factory.mktemp("check") / "rehearsal"
    return check_bundle(default_bundle, work_dir=work, keep=True), work


def test_image_stand_in_runs_the_forks_pins(image):
    pins = dict(p.split("==") for p in IMAGE_PINS)
    assert image.versions["python"].startswith("3.10.")
    assert image.versions["torch"].split("+")[0] == pins["torch"]
    assert image.versions["transformers"] == pins["transformers"]


def test_the_lock_ships_no_torch_and_no_torchao():
    names = {w.name for w in load_lock()}
    assert not names & {"torch", "torchao"}


def test_the_default_bundle_is_uploadable_on_the_image_stack(checked):
    report, _ = checked
    assert report.uploadable, report.not_uploadable_because + " | " + " | ".join(
        f"{s.name}: {s.detail}" for s in report.steps if s.status == FAIL)
    assert report.stack == "image stack"
    status = {s.name: s.status for s in report.steps}
    assert status["wheels on CPython 3.10"] == SKIP  # not needed: the wheels went into the 3.10 overlay itself


def test_every_rehearsal_step_ran_on_the_images_python_and_torch(checked):
    report, _ = checked
    steps = {s.name: s for s in report.steps}
    assert steps["image stand-in"].versions["transformers"] == "4.57.1"  # the image's own
    for name in ("prepare_env.sh", "bundled wheels", "prepare_model.sh", "verify"):
        v = steps[name].versions
        assert v["python"].startswith("3.10.") and v["torch"].split("+")[0] == "2.9.1", (name, v)
        assert v["transformers"] == "5.20.2", (name, v)  # the bundle's, shadowing the image's 4.57.1


def test_overlay_imports_the_quantization_stack_from_the_bundle(checked):
    _, work = checked
    root = work / "bundle"
    overlay = root / ".soarpack" / "venv" / "bin" / "python"
    proc = subprocess.run([str(overlay), "-c", OVERLAY_PROBE], capture_output=True, text=True, env=clean_env(), cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["gptqmodel"].startswith("7.6.0")
    assert got["soarpack"].startswith(str(root / "src"))
    log = (root / "logs" / "prepare_model.log").read_text()
    assert "phase quantize: ok" in log and "phase verify: ok" in log
