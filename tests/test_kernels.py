"""`soarpack kernels`: workloads from recipes and checkpoints, thresholds from a measured table in the form patch 04
reads, the JSON of a run through a stand-in GPU backend (tests/kernels_standin.py), and the refusal without a GPU.
The CUDA backend itself (sgl_kernel's or the extension's Marlin, CUDA graphs) cannot run here: only the stand-in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.kernels import measure as K
from soarpack.kernels.thresholds import NEVER, choose_thresholds, dispatch_spec
from soarpack.kernels.workload import SHAPE_CLASSES, recipe_workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels_standin  # noqa: E402

STANDIN = "kernels_standin:backend"


def _linears(w):
    return {(ln.cls, ln.bits): ln.count for ln in w.linears}


@pytest.mark.needs_torch  # the release shape comes from soarpack.sala.release (imports torch)
def test_recipe_workloads_count_the_fused_linears_of_the_release_shape():
    full = recipe_workload("w4-full")
    assert _linears(full) == {("sparse_qkv", 4): 8, ("lightning_qkv", 4): 24, ("attn", 4): 64,
                              ("gate_up", 4): 32, ("down", 4): 32}
    mlp = recipe_workload("w4-mlp")
    assert _linears(mlp) == {("sparse_qkv", 16): 8, ("lightning_qkv", 16): 24, ("attn", 16): 64,
                             ("gate_up", 4): 32, ("down", 4): 32}
    bal = recipe_workload("w4-balanced")  # sparse layers' and the last 8 Lightning layers' attention at W8
    assert _linears(bal) == {("sparse_qkv", 8): 8, ("lightning_qkv", 8): 8, ("lightning_qkv", 4): 16,
                             ("attn", 8): 32, ("attn", 4): 32, ("gate_up", 4): 32, ("down", 4): 32}
    assert all(ln.dispatchable for ln in full.linears)


@pytest.mark.needs_torch  # quant.finalize imports gptq_format (torch)
def test_checkpoint_workload_reads_quantize_config(tmp_path):
    from soarpack.kernels.workload import checkpoint_workload
    from soarpack.recipe.checkpoint import quantization_config
    from soarpack.recipe.model import load_recipe
    from soarpack.sala.config import SalaConfig
    from soarpack.sala.release import release_config_dict

    raw = release_config_dict()
    config = SalaConfig.from_dict(raw)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "quantize_config.json").write_text(json.dumps(quantization_config(load_recipe("w4-balanced"), config, ["gptqmodel:7.6.0"])))
    assert _linears(checkpoint_workload(tmp_path)) == _linears(recipe_workload("w4-balanced"))
    (tmp_path / "quantize_config.json").unlink()
    with pytest.raises(K.ConfigError, match="quantize_config.json is missing"):
        checkpoint_workload(tmp_path)


def _rows(times):
    """rows of one shape from {M: (marlin_us, dequant_us)}"""
    return [{"class": "gate_up", "shape": "32768x4096", "bits": 4, "M": m, "marlin_us": a, "dequant_us": b}
            for m, (a, b) in times.items()]


def test_thresholds_are_the_smallest_m_from_which_dequant_wins_at_every_larger_m():
    t = {1: (10, 50), 64: (30, 25), 128: (24, 26), 256: (40, 30), 512: (60, 40)}
    assert choose_thresholds(_rows(t)) == {("gate_up", 4): 256}  # the win at 64 is not kept: 128 went to Marlin
    assert choose_thresholds(_rows({1: (10, 50), 8192: (90, 100)})) == {("gate_up", 4): NEVER}
    assert choose_thresholds(_rows({1: (60, 50), 8: (60, 50)})) == {("gate_up", 4): 1}
    # one class, two shapes ("other"): the larger threshold, right for both
    rows = [dict(r, **{"class": "other", "shape": "a"}) for r in _rows({64: (30, 20), 512: (60, 40)})]
    rows += [dict(r, **{"class": "other", "shape": "b"}) for r in _rows({64: (20, 30), 512: (60, 40)})]
    assert choose_thresholds(rows) == {("other", 4): 512}


@pytest.mark.needs_torch
def test_the_spec_is_read_back_by_patch_04_exactly():
    from soarpack.kernels.block import load_dispatch_block

    chosen = {("attn", 4): 64, ("gate_up", 8): 1024, ("down", 4): NEVER, ("other", 4): 300}
    spec = dispatch_spec(chosen)
    block = load_dispatch_block(dispatch=spec)
    assert block.SOARPACK_W4_ENABLED
    want = {**block.SOARPACK_W4_THRESHOLDS, **chosen}
    assert block.SOARPACK_W4_ACTIVE == want
    assert block.soarpack_w4_route(1 << 20, 4096, 16384, 4) == "marlin"  # NEVER: beyond any batch
    assert block.SOARPACK_W4_SHAPE_CLASSES == SHAPE_CLASSES  # one naming of the shape classes


@pytest.mark.needs_torch  # the release shape comes from soarpack.sala.release (imports torch)
def test_run_through_a_stand_in_backend_gives_the_table_rollup_and_spec():
    kernels_standin.CALLS.clear()
    res = K.run_kernels(recipes=["w4-mlp", "w4-full"], ms=[1, 8, 16, 256, 8192], backend=kernels_standin.backend())
    # every quantized shape once at its width; no bf16-only pass, since every shape is W4 in w4-full
    assert sorted(c[:3] for c in kernels_standin.CALLS) == sorted((n, k, 4) for n, k in SHAPE_CLASSES)
    assert res["thresholds"] == {f"{c}:4": 256 for c in sorted(SHAPE_CLASSES.values())}
    assert res["dispatch_env"] == ",".join(f"{c}:4=256" for c in sorted(SHAPE_CLASSES.values()))
    row = next(r for r in res["rows"] if r["class"] == "gate_up" and r["M"] == 1)
    n, k = 32768, 4096
    assert row["read_floor_us"] == pytest.approx((n * k // 2 + n * 32 * 2 + (k + n) * 2) / 4000e3)
    assert row["winner"] == "splitk" and row["splitk_vs_marlin"] == pytest.approx(0.8)
    assert row["marlin_vs_floor"] == pytest.approx(row["marlin_us"] / row["read_floor_us"])
    roll = {(r["workload"], r["step"], r["M"]): r for r in res["rollup"]}
    assert set(roll) == {(w, s, m) for w in ("bf16", "w4-mlp", "w4-full") for s, m in (("decode", 1), ("decode", 8), ("prefill", 8192))}
    full = res["workloads"][2]
    # the roll-up is the count-weighted sum of the rows
    rows = {(r["size_n"], r["size_k"], r["M"]): r for r in res["rows"]}
    want = sum(ln["count"] * rows[(ln["size_n"], ln["size_k"], 8192)]["dequant_us"] for ln in full["linears"]) / 1e3
    assert roll[("w4-full", "prefill", 8192)]["chosen_ms"] == pytest.approx(want)
    want = sum(ln["count"] * rows[(ln["size_n"], ln["size_k"], 1)]["marlin_us"] for ln in full["linears"]) / 1e3
    assert roll[("w4-full", "decode", 1)]["marlin_ms"] == pytest.approx(want)
    assert roll[("w4-full", "decode", 1)]["best_ms"] == pytest.approx(0.8 * want)
    mlp = roll[("w4-mlp", "decode", 1)]
    assert mlp["bf16_ms"] == roll[("bf16", "decode", 1)]["bf16_ms"] == roll[("w4-full", "decode", 1)]["bf16_ms"]
    assert mlp["floor_ms"] > roll[("w4-full", "decode", 1)]["floor_ms"]  # attention stays 16-bit in w4-mlp
    json.dumps(res)  # JSON-ready


@pytest.mark.needs_torch  # the release shape comes from soarpack.sala.release (imports torch)
def test_cli_json_with_the_stand_in(monkeypatch):
    monkeypatch.setenv(K.BACKEND_ENV, STANDIN)
    r = CliRunner().invoke(app, ["kernels", "--recipe", "w4-mlp", "--m", "1,8,8192", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res["device"]["marlin"] == "stand-in sgl_kernel"
    assert {(x["workload"], x["M"]) for x in res["rollup"]} == {(w, m) for w in ("bf16", "w4-mlp") for m in (1, 8, 8192)}
    assert res["dispatch_env"] == "down:4=8192,gate_up:4=8192"
    r = CliRunner().invoke(app, ["kernels", "--recipe", "w4-mlp", "--m", "1,8192"])
    assert r.exit_code == 0 and "export SOARPACK_W4_DISPATCH=down:4=8192,gate_up:4=8192" in r.output


def test_cli_says_it_needs_a_cuda_gpu(monkeypatch):
    monkeypatch.delenv(K.BACKEND_ENV, raising=False)
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
    except ImportError:
        pass
    r = CliRunner().invoke(app, ["kernels", "--recipe", "w4-mlp"])
    assert r.exit_code == 2
    assert "needs a CUDA GPU" in r.output
    r = CliRunner().invoke(app, ["kernels", "--m", "1,x"])
    assert r.exit_code == 2 and "--m" in r.output


def test_a_bad_backend_or_marlin_path_is_one_error_line(monkeypatch, tmp_path):
    monkeypatch.setenv(K.BACKEND_ENV, "no_such_module:backend")
    r = CliRunner().invoke(app, ["kernels", "--recipe", "w4-mlp"])
    assert r.exit_code == 2 and "SOARPACK_KERNELS_BACKEND=no_such_module:backend: cannot load it" in r.output


@pytest.mark.needs_torch
def test_a_missing_marlin_extension_is_refused(tmp_path):
    from soarpack.kernels.cuda import load_marlin

    pytest.importorskip("torch")
    try:
        import sgl_kernel  # noqa: F401

        pytest.skip("sgl_kernel imports here: it is taken before --marlin-ext")
    except ImportError:
        pass
    with pytest.raises(K.ConfigError, match="does not exist"):
        load_marlin(str(tmp_path / "missing.so"))
    assert load_marlin(None) is None


# -- the FP8 route (patch 05) ---------------------------------------------------------------------------------


def _fp8_rows(times, cls="gate_up", shape="32768x4096", bits=4):
    """rows of one shape from {M: (marlin_us, dequant_us, fp8_us)}"""
    return [{"class": cls, "shape": shape, "bits": bits, "M": m, "marlin_us": a, "dequant_us": b, "fp8_us": c}
            for m, (a, b, c) in times.items()]


def test_fp8_thresholds_are_where_fp8_beats_both_w4_routes_at_every_larger_m():
    from soarpack.kernels.thresholds import choose_fp8_thresholds, fp8_spec

    t = {1: (10, 50, 20), 64: (30, 25, 20), 128: (24, 26, 25), 256: (40, 30, 29), 512: (60, 40, 30)}
    assert choose_fp8_thresholds(_fp8_rows(t)) == {("gate_up", 4): 256}  # 64 won, 128 lost: not kept
    assert choose_fp8_thresholds(_fp8_rows({1: (10, 50, 20), 8192: (90, 80, 85)})) == {("gate_up", 4): NEVER}
    # the sparse layers' q/k/v: measured, but written "off" (accuracy undecided); NEVER is "off" too
    chosen = {("gate_up", 4): 256, ("sparse_qkv", 4): 128, ("down", 8): NEVER}
    assert fp8_spec(chosen) == "down:8=off,gate_up:4=256,sparse_qkv:4=off"
    assert fp8_spec(chosen, kept_off=()) == "down:8=off,gate_up:4=256,sparse_qkv:4=128"


@pytest.mark.needs_torch
def test_the_fp8_spec_is_read_back_by_patch_05_exactly():
    from soarpack.kernels.block import load_dispatch_block
    from soarpack.kernels.thresholds import fp8_spec

    chosen = {("attn", 4): 64, ("gate_up", 8): 1024, ("down", 4): NEVER, ("sparse_qkv", 4): 128}
    block = load_dispatch_block(dispatch="", fp8=True, fp8_spec=fp8_spec(chosen))
    assert block.SOARPACK_FP8_ENABLED
    want = {**block.SOARPACK_FP8_THRESHOLDS, ("attn", 4): 64, ("gate_up", 8): 1024, ("down", 4): block.SOARPACK_FP8_NEVER,
            ("sparse_qkv", 4): block.SOARPACK_FP8_NEVER}
    assert block.SOARPACK_FP8_ACTIVE == want
    assert block.SOARPACK_FP8_NEVER == NEVER  # one "never" for the table and the patch
    assert block.soarpack_fp8_route(1 << 20, 4096, 16384, 4) != "fp8"


@pytest.mark.needs_torch  # the release shape comes from soarpack.sala.release (imports torch)
def test_the_fp8_route_through_the_stand_in_gives_thresholds_bar_and_rollup():
    ms = list(K.M_DEFAULT)
    assert ms[0] == 1 and ms[-1] == 16384 and {4096, 8192} <= set(ms)
    res = K.run_kernels(recipes=["w4-mlp", "w4-full"], ms=ms, backend=kernels_standin.backend())
    classes = sorted(SHAPE_CLASSES.values())
    assert res["fp8_thresholds"] == {f"{c}:4": 128 for c in classes}  # the stand-in's FP8 crossover
    assert res["fp8_env"] == ",".join(f"{c}:4={'off' if c == 'sparse_qkv' else 128}" for c in classes)
    assert res["fp8_kept_off"] == {"sparse_qkv:4": 128}
    bar = res["fp8_bar"]
    assert bar["ok"] is True and bar["decode_marlin"] is True and bar["decode_not_marlin"] == []
    assert {(s["shape"], s["M"]) for s in bar["shapes"]} == {(f"{n}x{k}", m) for n, k in SHAPE_CLASSES for m in (4096, 8192)}
    row = next(r for r in res["rows"] if r["class"] == "down" and r["M"] == 8192)
    assert row["winner"] == "fp8" and row["fp8_vs_bf16"] == pytest.approx(row["fp8_us"] / row["bf16_us"])
    assert next(r for r in res["rows"] if r["class"] == "down" and r["M"] == 32)["winner"] != "fp8"
    rows = {(r["size_n"], r["size_k"], r["M"]): r for r in res["rows"]}
    roll = {(r["workload"], r["step"], r["M"]): r for r in res["rollup"]}
    mlp = next(w for w in res["workloads"] if w["name"] == "w4-mlp")
    # patches 04 + 05 on w4-mlp at a prefill chunk: the W4 linears through FP8, the 16-bit ones bf16
    want = sum(ln["count"] * rows[(ln["size_n"], ln["size_k"], 8192)]["fp8_us" if ln["bits"] == 4 else "bf16_us"]
               for ln in mlp["linears"]) / 1e3
    assert roll[("w4-mlp", "prefill", 8192)]["fp8_prefill_ms"] == pytest.approx(want)
    # ... and Marlin at decode (the FP8 threshold is above 8)
    want = sum(ln["count"] * rows[(ln["size_n"], ln["size_k"], 8)]["marlin_us" if ln["bits"] == 4 else "bf16_us"]
               for ln in mlp["linears"]) / 1e3
    assert roll[("w4-mlp", "decode", 8)]["fp8_prefill_ms"] == pytest.approx(want)
    # the fork's --quantization fp8 on the bf16 workload: every linear through FP8 at every M
    bf16 = res["workloads"][0]
    want = sum(ln["count"] * rows[(ln["size_n"], ln["size_k"], 1)]["fp8_us"] for ln in bf16["linears"]) / 1e3
    assert roll[("bf16", "decode", 1)]["fp8_all_ms"] == pytest.approx(want)
    assert roll[("bf16", "prefill", 8192)]["fp8_all_vs_bf16"] < 0.7
    text = K.render_text(res)
    assert f"export SOARPACK_FP8_PREFILL={res['fp8_env']}" in text
    assert "issue 37's bar (FP8 <= 0.70x bf16 at M = 4096, 8192 on every shape; Marlin at M <= 32): MET" in text
    assert "kept off (accuracy undecided" in text and "sparse_qkv:4=128" in text
    json.dumps(res)


@pytest.mark.needs_torch
def test_the_bar_is_not_judged_without_its_m_and_fails_where_fp8_is_slow():
    res = K.run_kernels(recipes=["w4-mlp"], ms=[1, 8, 8192], backend=kernels_standin.backend())
    assert res["fp8_bar"]["ok"] is None  # no M = 4096
    slow = kernels_standin.StandIn(fp8_crossover=1 << 20)  # FP8 slower than W4 everywhere
    res = K.run_kernels(recipes=["w4-mlp"], ms=[1, 32, 4096, 8192], backend=slow)
    assert res["fp8_bar"]["ok"] is False and "NOT MET" in K.render_text(res)
    assert set(res["fp8_thresholds"].values()) == {NEVER} and "gate_up:4=off" in res["fp8_env"]
    early = kernels_standin.StandIn(fp8_crossover=16)  # FP8 from M = 16: not Marlin at decode
    bar = K.run_kernels(recipes=["w4-mlp"], ms=[1, 16, 32, 4096, 8192], backend=early)["fp8_bar"]
    assert bar["ok"] is False and bar["decode_marlin"] is False
    assert {(d["M"], d["route"]) for d in bar["decode_not_marlin"]} == {(16, "fp8"), (32, "fp8")}
