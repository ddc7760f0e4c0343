"""Issue 37's profiles: `fp8` (the fork's own --quantization fp8 on the original checkpoint, recipe bf16 = method
"none": nothing quantized, prepare_model.sh copies the original) and `fast-fp8` (w4-mlp-w8-attn + patches 04 and 05); the
fp8_e5m2 KV profile renamed `fp8-kv`. Each says its FP8 accuracy risk in build, check, inspect and compare."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.bundle.build import build_bundle
from soarpack.cli import app
from soarpack.errors import ConfigError
from soarpack.recipe.model import load_recipe, recipe_from_text, render_toml
from soarpack.recipe.profile import load_profile, recorded_profile

ROOT = Path(__file__).resolve().parent.parent
QUIET = dict(wheels=False)


def _preprocess():
    spec = importlib.util.spec_from_file_location("preprocess_model_under_test", ROOT / "preprocess_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bf16_recipe_quantizes_nothing():
    rec = load_recipe("bf16")
    assert rec.method == "none" and not rec.quantizes and rec.rules == () and rec.calibration is None
    back = recipe_from_text(render_toml(rec), default_name="x", source="x")
    assert back.method == "none" and "bits" not in render_toml(rec)
    assert "method" not in render_toml(load_recipe("w4-mlp"))  # a GPTQ recipe's TOML is what it was
    for extra in ("bits = 8", '[[quant.rules]]\nlayers = "all"\nmodules = ["attn"]\nquantize = false',
                  "[calibration]\nrows = 8"):
        with pytest.raises(ConfigError, match='method = "none" quantizes nothing'):
            recipe_from_text('[quant]\nmethod = "none"\n' + extra, default_name="x", source="x")
    with pytest.raises(ConfigError):
        recipe_from_text('[quant]\nmethod = "awq"\n', default_name="x", source="x")


@pytest.mark.needs_torch
def test_the_bf16_plan_keeps_every_linear_16_bit_and_quantize_refuses_it(tiny_model_dir, tmp_path):
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize
    from soarpack.sala.config import load_config

    config = load_config(tiny_model_dir)
    assert set(load_recipe("bf16").plan(config).values()) == {None}
    assert len(load_recipe("bf16").plan(config)) == len(config.decoder_linears())
    with pytest.raises(ConfigError, match="quantizes nothing"):
        quantize(tiny_model_dir, tmp_path / "out", quantize_options(recipe="bf16", device="cpu"))
    assert not (tmp_path / "out").exists()


def test_an_fp8_bundle_ships_no_calibration_and_says_its_risk(tmp_path):
    built = build_bundle(tmp_path / "fp8.tar.gz", profile="fp8", **QUIET)
    quant = built.manifest["quantize"]
    assert (quant["recipe"], quant["method"], quant["calib"], quant["held_out"]) == ("bf16", "none", [], [])
    assert built.manifest["profile"]["args"][:2] == ["--quantization", "fp8"]
    names = [r.name for r in built.risks]
    assert names == ["profile-flagged"], names  # no calibration risk: nothing is calibrated
    assert "W8A8 FP8 accuracy on SALA is unknown" in built.risks[0].message
    assert "75-77.5" in built.risks[0].message and built.risks[0].source == "docs/evidence.md#fp8-w8a8"
    assert not any(r.blocks for r in built.risks)  # unknown is not a measured failure: it does not block
    checked = CliRunner().invoke(app, ["check", str(built.path), "--no-rehearse"])
    assert built.risks[0].line() in checked.stdout
    steps = CliRunner().invoke(app, ["inspect", str(built.path), "--steps", "--json"])
    runs = next(s for s in json.loads(steps.stdout)["steps"] if s["name"] == "prepare_model.sh")["runs"]
    assert [r["phase"] for r in runs] == ["copy", "verify"] and "--original ORIGINAL" in runs[1]["command"]
    with pytest.raises(ConfigError, match="quantizes nothing.*--calib has no use"):
        calib = tmp_path / "c.jsonl"
        calib.write_text('{"text": "a b c"}\n')
        build_bundle(tmp_path / "x.tar.gz", profile="fp8", calib=[calib], **QUIET)
    with pytest.raises(ConfigError, match="--rows has no use"):
        build_bundle(tmp_path / "y.tar.gz", profile="fp8", rows=64, **QUIET)


def test_a_fast_fp8_bundle_carries_both_patches_and_the_fp8_risk(tmp_path):
    built = build_bundle(tmp_path / "ff.tar.gz", profile="fast-fp8", calib_rows=8, **QUIET)
    assert built.manifest["profile"]["patches"] == ["w4-dispatch", "fp8-prefill"]
    assert built.manifest["quantize"]["recipe"] == "w4-mlp-w8-attn" and "method" not in built.manifest["quantize"]
    flagged = [r for r in built.risks if r.name == "profile-flagged"]
    assert flagged and "FP8 activations in prefill are unmeasured" in flagged[0].message
    assert flagged[0].source == "docs/evidence.md#fp8-prefill"


def test_a_manifest_from_before_the_rename_keeps_its_fp8_kv_evidence():
    """A bundle built when `fp8` named the fp8_e5m2 KV profile, without recorded evidence: its risks are fp8-kv's."""
    from soarpack.bundle.risks import manifest_risks

    kv = load_profile("fp8-kv")
    assert recorded_profile("fp8", kv.args) == "fp8-kv"
    assert recorded_profile("fp8", load_profile("fp8").args) == "fp8" and recorded_profile("safe", kv.args) == "safe"
    old = {"profile": {"name": "fp8", "args": kv.args}, "quantize": {"recipe": "w4-mlp", "recipe_name": "w4-mlp"}}
    risks = manifest_risks(old)
    assert risks[0].name == "profile-below-gate" and "profile fp8: peers measured ori 75-77.5" in risks[0].message
    new = {"profile": {"name": "fp8", "args": load_profile("fp8").args}, "quantize": {"recipe": "bf16"}}
    assert [r.name for r in manifest_risks(new)] == ["profile-flagged"]


def test_compare_names_the_fp8_risk_of_a_runs_bundle(tmp_path):
    def bench(label, profile, recipe):
        path = tmp_path / f"{label}.json"
        tiers = {t: {"duration_s": d} for t, d in (("s1", 100.0), ("s8", 80.0), ("smax", 60.0))}
        path.write_text(json.dumps({"kind": "soarpack.bench", "version": 2, "tiers": tiers, "measured": {
            "label": label, "bundle": {"id": "x", "profile": profile, "recipe": recipe}}}))
        return path

    files = [bench("ff", "fast-fp8", "w4-mlp-w8-attn"), bench("plain", "safe", "w4-mlp")]
    from soarpack.measure.compare import load_runs
    from soarpack.bundle.risks import evidence_risk_lines

    runs = {r.name: r for r in load_runs(files, risks=evidence_risk_lines)}
    assert runs["plain"].risks == []
    assert len(runs["ff"].risks) == 1 and "profile fast-fp8" in runs["ff"].risks[0]
    result = CliRunner().invoke(app, ["compare", *map(str, files)])
    assert result.exit_code == 0, result.output
    assert "ff: risk profile-flagged: profile fast-fp8: FP8 activations in prefill are unmeasured" in result.stdout
    as_json = json.loads(CliRunner().invoke(app, ["compare", *map(str, files), "--json"]).stdout)
    assert [r["risks"] for r in as_json["runs"]][1] == []


# -- the copy that replaces quantization ----------------------------------------------------------------------


def _model(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "minicpm_sala"}')
    (path / "model.safetensors").write_bytes(os.urandom(4096))
    (path / "tokenizer.json").write_text("{}")
    (path / "sub" / "x.py").write_text("X = 1\n")
    return path


def _files(root: Path):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_preprocess_copies_the_original_file_for_file(tmp_path, monkeypatch):
    pre = _preprocess()
    src = _model(tmp_path / "orig")
    out = tmp_path / "served"
    assert pre.copy_original(src, out).endswith("0 copied")  # same filesystem: hard links
    assert _files(out) == _files(src) and (out / "model.safetensors").samefile(src / "model.safetensors")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging folder left
    # another filesystem (or one refusing links): copies; an existing output is replaced only once the copy is whole
    (out / "stale.txt").write_text("old")
    monkeypatch.setattr(pre.os, "link", lambda *a: (_ for _ in ()).throw(OSError(18, "Invalid cross-device link")))
    assert pre.copy_original(src, out) == "0 files hard-linked, 4 copied"
    assert _files(out) == _files(src) and not (out / "model.safetensors").samefile(src / "model.safetensors")
    assert pre.quantize_method({"quantize": {"method": "none"}}) == "none"
    assert pre.quantize_method({"quantize": {"recipe": "w4-mlp"}}) == "gptq"  # bundles before the field
    with pytest.raises(pre.Failure, match="neither gptq nor none"):
        pre.quantize_method({"quantize": {"method": "awq"}})


def test_a_failed_copy_leaves_the_output_as_it_was(tmp_path, monkeypatch):
    pre = _preprocess()
    src = _model(tmp_path / "orig")
    out = tmp_path / "served"
    out.mkdir()
    (out / "keep.txt").write_text("before")

    def fail(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pre.os, "link", fail)
    monkeypatch.setattr(pre.shutil, "copy2", fail)
    with pytest.raises(pre.Failure, match="cannot copy"):
        pre.copy_original(src, out)
    assert _files(out) == {"keep.txt": b"before"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.needs_torch
def test_verify_checks_an_unquantized_copy_against_the_original(tiny_model_dir, tmp_path):
    import shutil

    from soarpack.quant.verify import verify_checkpoint

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    assert verify_checkpoint(copy, tiny_model_dir) == []
    assert [p.code for p in verify_checkpoint(copy)] == ["config"]  # without --original: nothing to hold it to
    shard = next(copy.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    (copy / "extra.txt").write_text("x")
    next(copy.glob("tokenizer*")).unlink()
    codes = sorted(p.code for p in verify_checkpoint(copy, tiny_model_dir))
    assert codes == ["copy-differs", "copy-extra", "copy-missing"], codes


# -- through the fork, on the image stand-in (conftest's image_python) ------------------------------------------


@pytest.mark.slow
@pytest.mark.image_stack
@pytest.mark.needs_torch
@pytest.mark.parametrize("commit", ["377b0b5eb", "d29fb130c"])
def test_the_original_checkpoint_loads_through_the_patched_fork_as_fp8(tiny_model_dir, sglang_fork_trees,
                                                                       image_python, tmp_path, commit):
    """serve-check of recipe bf16 under the fp8 profile's args: every decoder linear is the fork's Fp8LinearMethod
    (quantized at load), every tensor lands, and the patched modules (05 included) import."""
    from soarpack.serve import forkcheck as F
    from soarpack.serve.patches import apply_patches

    tree = tmp_path / "patched" / "python"
    apply_patches(sglang_fork_trees[commit], tree)
    result = F.run_fork_check(tiny_model_dir, tree, recipe="bf16", python=image_python,
                              server_args=load_profile("fp8").args)
    assert result.ok, (result.problems, (result.log or "")[-2000:])
    report = result.report
    assert report["quant_config_class"] == "Fp8Config" and report["quantization"] == "fp8"
    assert {row.method for row in result.rows} == {"Fp8LinearMethod"} and result.rows
    assert report["orphans"] == [] and F.unwritten_required(report) == []
    skipped = {u["param"].rsplit(".", 1)[1] for u in report["unwritten"]}
    assert skipped <= {"k_scale", "v_scale"}  # the fork sets absent KV scales to 1.0 itself
    assert len(report["patched_modules"]) == len(F.patched_files())
    # the same checkpoint under a GPTQ method is a lint error (and the fork would find no qweight)
    from soarpack.serve.lint import lint_args

    assert "quantization-recipe" in {f.rule for f in lint_args(load_profile("safe").args, recipe="bf16")}


@pytest.fixture(scope="module")
def probe_wheels(tmp_path_factory):
    from soarpack.bundle.wheels import make_pure_wheel

    d = tmp_path_factory.mktemp("wheels")
    make_pure_wheel(d, "soarpack-ci-probe", "1.0", {"soarpack_ci_probe.py": "X = 1\n"})
    return d


@pytest.mark.slow
@pytest.mark.image_stack
@pytest.mark.needs_torch
@pytest.mark.parametrize("profile,commit", [("fp8", "377b0b5eb"), ("fast-fp8", "d29fb130c")])
def test_check_rehearses_both_profiles_end_to_end(tmp_path, probe_wheels, sglang_fork_trees, profile, commit):
    """`check` (development stack, the fork given): prepare_env.sh patches the fork where the profile needs it,
    prepare_model.sh copies (fp8) or quantizes (fast-fp8) the tiny model, verify passes, the fork loads it."""
    from soarpack.rehearse.check import PASS, check_bundle

    bundle = build_bundle(tmp_path / "b.tar.gz", profile=profile, wheel_dir=probe_wheels, calib_rows=16).path
    report = check_bundle(bundle, sglang_src=sglang_fork_trees[commit], dev_stack=True)
    steps = {s.name: s for s in report.steps}
    for name in ("prepare_env.sh", "prepare_model.sh", "verify", "fork loads it"):
        assert steps[name].status == PASS, (name, steps[name].detail)
    assert steps["fork loads it"].data["fork_commit"] == commit and steps["fork loads it"].data["problems"] == []
    if profile == "fp8":
        assert steps["sglang patches"].status != "fail"
        assert "copied" in steps["prepare_model.sh"].detail and steps["fork loads it"].data["recipe"] == "bf16"
    else:
        assert steps["sglang patches"].status == PASS, steps["sglang patches"].detail
        assert steps["fork loads it"].data["recipe"] == "w4-mlp-w8-attn"
    assert "profile-flagged" in [r.name for r in report.risks]


@pytest.mark.slow
@pytest.mark.image_stack
@pytest.mark.needs_torch
@pytest.mark.parametrize("profile,commit", [("fp8", "377b0b5eb"), ("fast-fp8", "d29fb130c")])
def test_both_profiles_are_uploadable_on_the_image_stack(tmp_path, sglang_fork_trees, image_python, profile, commit):
    """The bundles with their real wheels, `soarpack check` on the image stand-in (its default stack) with the fork
    given: prepare_env.sh (patching the fork for fast-fp8), prepare_model.sh (a copy for fp8, GPTQ for fast-fp8),
    verify and the fork's own loader all pass; the FP8 risk is named and does not block."""
    from soarpack.rehearse.check import FAIL, PASS, check_bundle

    bundle = build_bundle(tmp_path / f"{profile}.tar.gz", profile=profile).path
    report = check_bundle(bundle, sglang_src=sglang_fork_trees[commit])
    failed = " | ".join(f"{s.name}: {s.detail}" for s in report.steps if s.status == FAIL)
    assert report.uploadable, f"{report.not_uploadable_because} | {failed}"
    assert report.stack == "image stack"
    steps = {s.name: s for s in report.steps}
    for name in ("prepare_env.sh", "bundled wheels", "prepare_model.sh", "verify", "fork loads it"):
        assert steps[name].status == PASS, (name, steps[name].detail)
    if profile == "fast-fp8":
        assert steps["sglang patches"].status == PASS, steps["sglang patches"].detail
    assert [r.name for r in report.risks if r.name == "profile-flagged"] and report.verdict_line().startswith("uploadable")
