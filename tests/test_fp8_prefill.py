"""Patch 05-fp8-prefill: the FP8 copy made at load, the route by M, the one registered op, and the kernels it calls.

The FP8 code is the block the patch adds to the fork's marlin_utils.py after patch 04's, loaded from a patched tree
exactly as the file has it (benchmarks/w4_dispatch_block.py, fp8=True); the rest of that module needs the server
stack. On a CPU the FP8 GEMM is torch._scaled_mm (rowwise), the fallback the block takes where sgl_kernel's
fp8_scaled_mm is not registered; sgl_kernel's own kernels run only on the device (benchmarks/gpu_fp8_prefill.py).
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

import torch  # noqa: E402  (conftest.NEEDS_TORCH lists this file)

from soarpack.errors import ConfigError  # noqa: E402
from soarpack.quant.gptq_format import dequantize, pack_cols, pack_rows  # noqa: E402
from soarpack.serve import patches as P  # noqa: E402
from soarpack.serve.lint import lint_args  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from w4_dispatch_block import FP8_BEGIN, FP8_END, MARLIN_UTILS, block_text, load_block  # noqa: E402

GPTQ = "sglang/srt/layers/quantization/gptq.py"
LOADER = "sglang/srt/model_loader/loader.py"
SHAPES = {"sparse_qkv": (4608, 4096), "attn": (4096, 4096), "lightning_qkv": (12288, 4096),
          "gate_up": (32768, 4096), "down": (4096, 16384)}


@pytest.fixture(scope="module")
def patched_trees(patched_fork_trees):
    return patched_fork_trees


@pytest.fixture(scope="module")
def block(patched_trees):
    return load_block(patched_trees["d29fb130c"], env={"SOARPACK_FP8_PREFILL": "", "SOARPACK_W4_DISPATCH": ""}, fp8=True)


def test_the_patch_applies_on_top_of_04_to_both_commits(sglang_fork_trees, patched_trees):
    for commit, src in sglang_fork_trees.items():
        report = P.check_tree(src, ["w4-dispatch", "fp8-prefill"])
        assert [(p.name, p.status) for p in report.patches] == [("w4-dispatch", "apply"), ("fp8-prefill", "apply")]
        again = P.check_tree(patched_trees[commit])
        assert (again.commit, again.state) == (commit, "patched")
        assert {p.status for p in again.patches} == {"applied"}
        assert P.apply_patches(patched_trees[commit], patched_trees[commit]).written == []  # nothing applied twice
        whole = (patched_trees[commit] / MARLIN_UTILS).read_text()
        text, first = block_text(patched_trees[commit] / MARLIN_UTILS, FP8_BEGIN, FP8_END)
        assert whole.count(text) == 1 and "def soarpack_fp8_route" in text
        assert block_text(patched_trees[commit] / MARLIN_UTILS)[1] < first  # after 04's block, whose names it uses
    a, b = (block_text(t / MARLIN_UTILS, FP8_BEGIN, FP8_END)[0] for t in patched_trees.values())
    assert a == b


def test_the_patch_is_refused_without_04(sglang_fork_trees, tmp_path):
    assert {p.name: p.requires for p in P.load_patches()}["fp8-prefill"] == ["w4-dispatch"]
    src = sglang_fork_trees["377b0b5eb"]
    with pytest.raises(ConfigError, match="'fp8-prefill' is written on top of w4-dispatch"):
        P.check_tree(src, ["fp8-prefill"])
    with pytest.raises(ConfigError, match="written on top of w4-dispatch"):
        P.apply_patches(src, tmp_path / "out", ["fp8-prefill"])
    assert not (tmp_path / "out").exists()
    args = ["--quantization", "gptq_marlin", "--dtype", "bfloat16", "--attention-backend", "minicpm_flashinfer",
            "--cuda-graph-max-bs", "32"]
    rules = {f.rule for f in lint_args(args, patched={"fp8-prefill"})}
    assert "patch-requires" in rules
    assert "patch-requires" not in {f.rule for f in lint_args(args, patched={"fp8-prefill", "w4-dispatch"})}


def test_the_linear_goes_through_one_registered_op(patched_trees):
    """apply routes a layer with an FP8 copy through torch.ops.sglang.soarpack_fp8_dispatch_gemm (M read inside
    it); the copy is made after Marlin's repack; the loader logs what the copies cost once the weights are done."""
    mu = ast.parse((patched_trees["377b0b5eb"] / MARLIN_UTILS).read_text())
    funcs = {f.name: f for f in mu.body if isinstance(f, ast.FunctionDef)}
    op = funcs["soarpack_fp8_dispatch_gemm"]
    (deco,) = op.decorator_list
    assert deco.func.id == "register_custom_op" and [k.arg for k in deco.keywords] == ["fake_impl"]
    assert "soarpack_fp8_gemm(" in ast.unparse(op)
    assert "soarpack_fp8_dispatch_gemm(" in ast.unparse(funcs["soarpack_fp8_apply_linear"])
    gptq = ast.parse((patched_trees["377b0b5eb"] / GPTQ).read_text())
    method = next(c for c in gptq.body if isinstance(c, ast.ClassDef) and c.name == "GPTQMarlinLinearMethod")
    meths = {f.name: ast.unparse(f) for f in method.body if isinstance(f, ast.FunctionDef)}
    apply_src = meths["apply"]
    assert apply_src.index("getattr(layer, 'soarpack_fp8_weight', None)") < apply_src.index("soarpack_fp8_apply_linear(") \
        < apply_src.index("apply_gptq_marlin_linear(")
    pwal = meths["process_weights_after_loading"]
    assert pwal.index("_transform_param(layer, self.w_s_name, transform_w_s)") < pwal.index("soarpack_fp8_prepare(")
    loader = (patched_trees["377b0b5eb"] / LOADER).read_text()
    fn = loader[loader.index("def load_weights_and_postprocess"):]
    fn = fn[:fn.index("\nclass ")]
    assert fn.index("quant_method.process_weights_after_loading(module)") < fn.index("soarpack_fp8_log_summary()")


def test_routes_per_shape_and_m(block):
    for bits in (4, 8):
        for cls, (n, k) in SHAPES.items():
            routes = {m: block.soarpack_fp8_route(m, n, k, bits) for m in (1, 8, 32, 128, 256, 4096, 8192)}
            assert all(routes[m] == "marlin" for m in (1, 8, 32)), (cls, bits)  # decode stays Marlin
            if cls == "sparse_qkv":  # off FP8 by default: patch 04's routes at every M
                assert routes[8192] == "dequant" and routes[256] == "dequant"
            else:
                assert routes[256] == routes[4096] == routes[8192] == "fp8", (cls, bits)
    assert block.soarpack_fp8_route(8192, 4096, 4096, 2) == "marlin"


def test_the_environment_overrides_the_thresholds(patched_trees):
    tree = patched_trees["d29fb130c"]

    def load(spec, w4=""):
        return load_block(tree, env={"SOARPACK_FP8_PREFILL": spec, "SOARPACK_W4_DISPATCH": w4}, fp8=True)

    off = load("off")
    assert not off.SOARPACK_FP8_ENABLED and off.soarpack_fp8_route(8192, 32768, 4096, 4) == "dequant"
    assert load("off", w4="off").soarpack_fp8_route(8192, 32768, 4096, 4) == "marlin"
    # FP8 without patch 04's dispatch: Marlin below the threshold, FP8 from it
    only = load("1024", w4="off")
    assert [only.soarpack_fp8_route(m, 4096, 4096, 4) for m in (512, 1024)] == ["marlin", "fp8"]
    assert only.soarpack_fp8_route(1024, 4608, 4096, 8) == "fp8"  # one number: every class, sparse_qkv too
    per = load("gate_up=64, down:8=off, sparse_qkv:4=512")
    assert per.SOARPACK_FP8_ACTIVE[("gate_up", 4)] == per.SOARPACK_FP8_ACTIVE[("gate_up", 8)] == 64
    assert per.SOARPACK_FP8_ACTIVE[("down", 8)] == per.SOARPACK_FP8_NEVER
    assert per.SOARPACK_FP8_ACTIVE[("down", 4)] == per.SOARPACK_FP8_THRESHOLDS[("down", 4)]
    assert per.soarpack_fp8_route(512, 4608, 4096, 4) == "fp8" and per.soarpack_fp8_route(512, 4608, 4096, 8) != "fp8"
    for bad in ("gate_up", "gateup=3", "down:16=4", "down=x", "down:x=4"):
        with pytest.raises(ValueError, match="SOARPACK_FP8_PREFILL: cannot read"):
            load(bad)


def _marlin_layer(block, k, n, bits, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=gen, dtype=torch.int32)
    scales = (torch.rand(k // 128, n, generator=gen) * 0.02 + 0.002).to(torch.bfloat16).to(torch.float16)
    qzeros = pack_cols(torch.full((k // 128, n), 2 ** (bits - 1) - 1, dtype=torch.int32), bits)
    w = dequantize(pack_rows(q, bits), qzeros, scales, None, bits, 128)  # fp32 [n, k], soarpack's own reading
    perm = torch.tensor(block._sp_scale_perm())
    marlin_s = scales.to(torch.bfloat16).reshape(-1, 64)[:, perm].reshape(-1, n)
    return w, block.soarpack_marlin_reference_repack(q, bits), marlin_s


@pytest.mark.parametrize("bits", [4, 8])
def test_the_fp8_copy_is_the_dequantized_weight_per_output_channel(block, bits):
    k, n = 384, 320
    w, mq, ms = _marlin_layer(block, k, n, bits, seed=bits)
    w_fp8, w_scale = block.soarpack_fp8_weight_copy(mq, ms, k, n, bits, rows=64)  # several row chunks
    assert w_fp8.dtype == torch.float8_e4m3fn and w_fp8.shape == (k, n) and w_fp8.stride() == (1, k)  # column-major
    assert w_scale.dtype == torch.float32 and w_scale.shape == (1, n)
    assert torch.equal(w_scale[0], w.abs().amax(dim=1) / 448.0)  # one scale per output channel, max |w| -> 448
    back = w_fp8.t().float() * w_scale.t()
    assert torch.all((back - w).abs() <= w.abs() * 2.0**-4 + 1e-12)  # e4m3 rounding: half an ulp of 3 mantissa bits
    assert (back - w).abs().max() > 0  # and it is a rounding (the test would not see a copy of the bf16 weight)
    # the rows' maxima land on 448 exactly
    assert torch.equal(w_fp8.t().float().abs().amax(dim=1), torch.full((n,), 448.0))


def test_the_fp8_route_matches_its_own_math_and_the_bf16_matmul(block):
    k, n, m = 512, 256, 300
    w, mq, ms = _marlin_layer(block, k, n, 4, seed=3)
    w_fp8, w_scale = block.soarpack_fp8_weight_copy(mq, ms, k, n, 4)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    out = block.soarpack_fp8_linear(x, w_fp8, w_scale)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    x_q, x_s = block.soarpack_fp8_quant_act(x)
    assert x_q.dtype == torch.float8_e4m3fn and x_s.shape == (m, 1)
    own = (x_q.float() * x_s) @ (w_fp8.t().float() * w_scale.t()).t()  # what the two quantized operands say
    assert ((out.float() - own).norm() / own.norm()).item() < 5e-3  # bf16 output rounding only
    ref = x.float() @ w.t()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert 5e-3 < err < 6e-2, err  # the e4m3 error of both operands (issue 37: 3.75 % measured on the H200)
    with pytest.raises(RuntimeError, match="fp8_scaled_mm is not registered"):
        block.soarpack_fp8_linear(x, w_fp8, w_scale, gemm="sgl")
    assert torch.equal(block.soarpack_fp8_linear(x, w_fp8, w_scale, gemm="torch"), out)


def test_prepare_makes_the_copy_only_where_it_applies_and_counts_its_cost(block):
    k, n = 256, 256
    _, mq, ms = _marlin_layer(block, k, n, 4, seed=5)
    empty = torch.empty(0, dtype=torch.int32)
    block.soarpack_fp8_summary()  # start from nothing
    assert block.soarpack_fp8_summary() is None
    layer = torch.nn.Module()
    assert block.soarpack_fp8_prepare(layer, mq, ms, empty, empty, 4, n, k)
    assert layer.soarpack_fp8_weight.dtype == torch.float8_e4m3fn and not layer.soarpack_fp8_weight.requires_grad
    assert dict(layer.named_parameters()).keys() == {"soarpack_fp8_weight", "soarpack_fp8_scale"}
    skipped = torch.nn.Module()
    assert not block.soarpack_fp8_prepare(skipped, mq, ms, torch.ones(3, dtype=torch.int32), empty, 4, n, k)  # zp
    assert not block.soarpack_fp8_prepare(skipped, mq, ms, empty, torch.arange(k), 4, n, k)  # act order
    assert not hasattr(skipped, "soarpack_fp8_weight")
    line = block.soarpack_fp8_summary()
    assert line.startswith("soarpack fp8-prefill: FP8 e4m3 weight copies of 1 GPTQ-Marlin linears: 0.00 GB")
    assert "other:4 x1" in line and "sparse_qkv:4=off" in line
    assert block.soarpack_fp8_summary() is None  # reset after it was said
    # the sparse layers' q/k/v shape class is off FP8 by default: no copy, no memory
    sparse = {"weight_zp": empty, "g_idx": empty, "weight_scale": torch.ones(32, 4608, dtype=torch.bfloat16),
              "num_bits": 4, "size_n": 4608, "size_k": 4096}
    assert not block.soarpack_fp8_applies(**sparse)
    assert block.soarpack_fp8_applies(**sparse, thresholds={**block.SOARPACK_FP8_ACTIVE, ("sparse_qkv", 4): 256})


def test_the_w4_mlp_copy_costs_what_the_patch_says():
    """The patch header's figure: w4-mlp's 32 gate_up + 32 down linears at 1 byte a weight + 4 per channel."""
    bytes_ = 32 * (32768 * 4096 + 32768 * 4) + 32 * (4096 * 16384 + 4096 * 4)
    assert round(bytes_ / 2**30, 1) == 6.0
    assert "about 6.0 GiB for w4-mlp" in (REPO / "sglang" / "05-fp8-prefill.patch").read_text()


def test_the_kernels_it_calls_have_one_signature_in_both_sgl_kernels():
    """sgl-kernel 0.3.20 (the image's) and sglang-kernel 0.4.5 (the device's) register fp8_scaled_mm and
    sgl_per_token_quant_fp8 with the same arguments; the block calls them through torch.ops.sgl_kernel. The one
    difference: 0.4.5 marks sgl_per_token_quant_fp8's outputs as written (`Tensor!`), 0.3.20 does not; an eager
    call (inside our opaque op) passes the same tensors either way."""
    text = (REPO / "sglang" / "05-fp8-prefill.patch").read_text()
    called = {"fp8_scaled_mm", "sgl_per_token_quant_fp8"}
    assert all(f'_sp_sgl_op("{name}")' in text for name in called)
    schemas = {}
    for version in ("0.3.20", "0.4.5"):
        recorded = json.loads((REPO / "benchmarks" / "gpu_serve" / f"sgl_kernel-{version}-ops.json").read_text())
        schemas[version] = {s.split("(", 1)[0]: s for s in recorded["schemas"]}
    for name in called:
        assert schemas["0.3.20"][name].replace("!", "") == schemas["0.4.5"][name].replace("!", ""), name
    assert schemas["0.3.20"]["fp8_scaled_mm"] == schemas["0.4.5"]["fp8_scaled_mm"] == (
        "fp8_scaled_mm(Tensor mat_a, Tensor mat_b, Tensor scales_a, Tensor scales_b, ScalarType out_dtype, "
        "Tensor? bias) -> Tensor")
    assert schemas["0.3.20"]["sgl_per_token_quant_fp8"] == \
        "sgl_per_token_quant_fp8(Tensor input, Tensor output_q, Tensor output_s) -> ()"
    assert schemas["0.4.5"]["sgl_per_token_quant_fp8"] == \
        "sgl_per_token_quant_fp8(Tensor input, Tensor! output_q, Tensor! output_s) -> ()"


def test_the_device_scripts_rehearse_on_the_cpu(tmp_path):
    """benchmarks/gpu_fp8_prefill.py numerics (the CPU stand-in of the fork's code: the same recipe by the patch's
    functions) and render (on a stand-in `soarpack kernels` JSON); the shell scripts parse."""
    import subprocess

    import gpu_fp8_prefill as G

    out = tmp_path / "n.json"
    assert G.main(["numerics", "--device", "cpu", "--shapes", "256x512", "--m", "4,64", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert {(r["bits"], r["M"], r["inputs"]) for r in res["rows"]} == {(b, m, i) for b in (4, 8) for m in (4, 64)
                                                                       for i in ("gaussian", "outliers")}
    for r in res["rows"]:
        assert r["bf16_vs_fp32"] < 5e-3 and 5e-3 < r["patch_vs_bf16"] < 6e-2 and 5e-3 < r["fork_vs_bf16"] < 6e-2
        assert r["patch_vs_fork"] < r["patch_vs_bf16"]  # the bf16 rounding of the weight, not the FP8 error
    assert "fork-recipe" in res["fork"]
    sys.path.insert(0, str(REPO / "tests"))
    import kernels_standin
    from soarpack.kernels import measure as K

    kres = K.run_kernels(recipes=["w4-mlp"], ms=[1, 32, 4096, 8192], backend=kernels_standin.backend())
    (tmp_path / "k.json").write_text(json.dumps(kres))
    text = G.render_kernels(json.loads((tmp_path / "k.json").read_text()))
    assert "Bar (FP8 route <= 0.7x bf16 at M = 4096 and 8192 on every shape; Marlin the route at M <= 32): **met**" in text
    assert f"`SOARPACK_FP8_PREFILL={kres['fp8_env']}`" in text and "| 32768x4096 (gate_up) | 4 | 8192 |" in text
    for script in ("benchmarks/gpu_fp8_prefill.sh", "benchmarks/gpu_serve/device_run.sh"):
        assert subprocess.run(["bash", "-n", str(REPO / script)]).returncode == 0, script
