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
