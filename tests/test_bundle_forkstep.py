"""`soarpack check`'s fork step: the rehearsal's quantized tiny model is loaded through the fork's own code
(ModelConfig, quant-config detection, MiniCPMSALAForCausalLM.load_weights) on the image stand-in, for each recipe,
and through our patch set where the profile needs it."""

from __future__ import annotations

import pytest

from soarpack.bundle.build import build_bundle
from soarpack.rehearse.check import FAIL, PASS, SKIP, check_bundle
from soarpack.bundle.wheels import make_pure_wheel

pytestmark = [pytest.mark.slow, pytest.mark.image_stack]


@pytest.fixture(scope="module")
def probe_wheels(tmp_path_factory):
    d = tmp_path_factory.mktemp("wheels")
    make_pure_wheel(d, "soarpack-ci-probe", "1.0", {"soarpack_ci_probe.py": "X = 1\n"})
    return d


def _rehearse(tmp_path, probe_wheels, fork, **build):
    bundle = build_bundle(tmp_path / "b.tar.gz", wheel_dir=probe_wheels, calib_rows=16, **build).path
    report = check_bundle(bundle, sglang_src=fork, dev_stack=True)
    return report, {s.name: s for s in report.steps}


@pytest.mark.parametrize("recipe", ["w4-mlp", "w4-full", "w4-balanced"])
def test_each_recipe_loads_through_the_fork(tmp_path, probe_wheels, sglang_fork_trees, recipe):
    report, steps = _rehearse(tmp_path, probe_wheels, sglang_fork_trees["377b0b5eb"], recipe=recipe)
    step = steps["fork loads it"]
    assert step.status == PASS, step.detail
    assert step.data["recipe"] == recipe and step.data["without_parameter"] == 0 and step.data["unwritten"] == 0
    assert step.data["as_planned"] == step.data["linears"] > 0 and step.data["problems"] == []
    assert step.versions["python"].startswith("3.10.") and step.versions["torch"].startswith("2.9.1")
    assert report.ok, [(s.name, s.detail) for s in report.steps if s.status == FAIL]


def test_the_patched_fork_loads_it_for_a_profile_with_patches(tmp_path, probe_wheels, sglang_fork_trees):
    report, steps = _rehearse(tmp_path, probe_wheels, sglang_fork_trees["d29fb130c"], profile="fp8-kv")
    assert steps["sglang patches"].status == PASS, steps["sglang patches"].detail
    assert steps["fork loads it"].status == PASS, steps["fork loads it"].detail
    assert steps["fork loads it"].data["fork_commit"] == "d29fb130c"


def test_without_a_fork_the_step_says_not_run(tmp_path, probe_wheels):
    bundle = build_bundle(tmp_path / "b.tar.gz", wheel_dir=probe_wheels, calib_rows=16).path
    steps = {s.name: s for s in check_bundle(bundle, dev_stack=True).steps}
    assert steps["fork loads it"].status == SKIP and steps["fork loads it"].data == {"missing": "sglang_src"}
    assert "--sglang-fork" not in steps["fork loads it"].detail and "--sglang-src" in steps["fork loads it"].detail
