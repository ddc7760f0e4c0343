"""Patch 04-w4-dispatch: the route by M, the dequantization from Marlin's layout, and the serving profile "fast".

The dispatch code is the block the patch adds to the fork's marlin_utils.py, loaded from a patched tree exactly as
the file has it (benchmarks/w4_dispatch_block.py); the rest of that module needs the server stack.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import torch  # noqa: E402  (conftest.NEEDS_TORCH lists this file)

from soarpack.quant.gptq_format import dequantize, pack_cols, pack_rows  # noqa: E402
from soarpack.serve import patches as P  # noqa: E402
from soarpack.serve.lint import lint_args  # noqa: E402
from soarpack.recipe.profile import load_profile  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from w4_dispatch_block import MARLIN_UTILS, block_text, load_block  # noqa: E402

SHAPES = {"sparse_qkv": (4608, 4096), "attn": (4096, 4096), "lightning_qkv": (12288, 4096),
          "gate_up": (32768, 4096), "down": (4096, 16384)}
TABLE_M = (1, 2, 4, 8, 16, 32, 64, 128, 512, 2048, 8192)


@pytest.fixture(scope="module")
def patched_trees(patched_fork_trees):
    return patched_fork_trees


@pytest.fixture(scope="module")
def block(patched_trees):
    return load_block(patched_trees["d29fb130c"])


def test_the_patch_applies_to_both_commits_and_adds_one_block(sglang_fork_trees, patched_trees):
    for commit, src in sglang_fork_trees.items():
        report = P.check_tree(src, ["w4-dispatch"])
        assert [(p.name, p.status) for p in report.patches] == [("w4-dispatch", "apply")], commit
        again = P.check_tree(patched_trees[commit])
        assert (again.commit, again.state) == (commit, "patched")
        text, first = block_text(patched_trees[commit] / MARLIN_UTILS)
        whole = (patched_trees[commit] / MARLIN_UTILS).read_text()
        assert "def soarpack_w4_route" in text and whole.count(text) == 1
        assert first < whole[:whole.index("def apply_gptq_marlin_linear(")].count("\n")  # defined before its user
        # applying again changes nothing (a patch that only appended lines would match its own context again)
        assert P.apply_patches(patched_trees[commit], patched_trees[commit]).written == []
    a, b = (block_text(t / MARLIN_UTILS)[0] for t in patched_trees.values())
    assert a == b


def test_the_linear_goes_through_one_registered_op(patched_trees):
    """Both routes sit behind torch.ops.sglang.soarpack_w4_dispatch_gemm, so M is read at run time, inside it."""
    tree = ast.parse((patched_trees["377b0b5eb"] / MARLIN_UTILS).read_text())
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    op = funcs["soarpack_w4_dispatch_gemm"]
    (deco,) = op.decorator_list
    assert deco.func.id == "register_custom_op" and [k.arg for k in deco.keywords] == ["fake_impl"]
    apply_src = ast.unparse(funcs["apply_gptq_marlin_linear"])
    assert apply_src.index("soarpack_w4_dispatch_applies(") < apply_src.index("soarpack_w4_dispatch_gemm(") \
        < apply_src.index("gptq_marlin_gemm(reshaped_x")
    assert "soarpack_w4_gemm(" in ast.unparse(op)


def test_routes_per_shape_and_m(block):
    for bits in (4, 8):
        for cls, (n, k) in SHAPES.items():
            assert block.soarpack_w4_shape_class(n, k) == cls
            thr = block.SOARPACK_W4_THRESHOLDS[(cls, bits)]
            routes = {m: block.soarpack_w4_route(m, n, k, bits) for m in TABLE_M}
            assert routes == {m: ("dequant" if m >= thr else "marlin") for m in TABLE_M}, (cls, bits)
            # the conditions, as the measured thresholds must place them
            assert all(routes[m] == "marlin" for m in (1, 2, 4, 8)), (cls, bits)
            assert all(routes[m] == "dequant" for m in (512, 2048, 8192)), (cls, bits)
    assert block.soarpack_w4_shape_class(256, 4096) == "other"
    assert block.soarpack_w4_route(8192, 4096 + 32, 4096, 4) == "marlin"  # not a multiple of 64: Marlin only
    assert block.soarpack_w4_route(8192, 4096, 4096, 2) == "marlin"


def test_the_environment_overrides_the_thresholds(patched_trees):
    tree = patched_trees["d29fb130c"]
    off = load_block(tree, env={"SOARPACK_W4_DISPATCH": "off"})
    assert not off.SOARPACK_W4_ENABLED and off.soarpack_w4_route(8192, 32768, 4096, 4) == "marlin"
    one = load_block(tree, env={"SOARPACK_W4_DISPATCH": "4"})
    assert {one.soarpack_w4_route(m, 4096, 4096, 8) for m in (1, 2, 3)} == {"marlin"}
    assert one.soarpack_w4_route(4, 4096, 16384, 4) == "dequant"
    per = load_block(tree, env={"SOARPACK_W4_DISPATCH": "gate_up=300, down:8=7"})
    assert per.SOARPACK_W4_ACTIVE[("gate_up", 4)] == per.SOARPACK_W4_ACTIVE[("gate_up", 8)] == 300
    assert per.SOARPACK_W4_ACTIVE[("down", 8)] == 7
    assert per.SOARPACK_W4_ACTIVE[("down", 4)] == per.SOARPACK_W4_THRESHOLDS[("down", 4)]
    for bad in ("gate_up", "gateup=3", "down:16=4", "down=x"):
        with pytest.raises(ValueError, match="SOARPACK_W4_DISPATCH: cannot read"):
            load_block(tree, env={"SOARPACK_W4_DISPATCH": bad})


def test_the_weight_permutation_is_gptqmodels_marlin_layout(block):
    """An independent copy of Marlin's 4-bit tile permutation (GPTQModel's); the GPU run checks the 8-bit one
    against the fork's own gptq_marlin_repack kernel."""
    marlin = pytest.importorskip("gptqmodel.nn_modules.qlinear.marlin")
    perm, scale_perm, _ = marlin._get_perms()
    assert block._sp_weight_perm(4) == perm.tolist()
    assert block._sp_scale_perm() == list(scale_perm)
    assert sorted(block._sp_weight_perm(8)) == list(range(1024))


def _gptq(k, n, bits, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 2**bits, (k, n), generator=gen, dtype=torch.int32)
    scales = (torch.rand(k // 128, n, generator=gen) * 0.02 + 0.002).to(torch.bfloat16).to(torch.float16)
    qzeros = pack_cols(torch.full((k // 128, n), 2 ** (bits - 1) - 1, dtype=torch.int32), bits)
    return q, pack_rows(q, bits), qzeros, scales


@pytest.mark.parametrize("bits", [4, 8])
def test_dequant_from_marlins_layout_is_soarpacks_dequantization(block, bits):
    k, n = 384, 320
    q, qweight, qzeros, scales = _gptq(k, n, bits, seed=bits)
    marlin_q = block.soarpack_marlin_reference_repack(q, bits)
    assert marlin_q.shape == (k // 16, n * 16 // (32 // bits)) and marlin_q.dtype == torch.int32
    perm = torch.tensor(block._sp_scale_perm())
    marlin_s = scales.to(torch.bfloat16).reshape(-1, 64)[:, perm].reshape(-1, n)
    w = block.soarpack_marlin_dequant_torch(marlin_q, marlin_s, k, n, bits, dtype=torch.float32)
    want = dequantize(qweight, qzeros, scales, None, bits, 128)
    assert torch.equal(w, want)
    assert torch.equal(w, dequantize(qweight, qzeros, scales, None, bits, 128, marlin=True))
    # the public entry point takes the torch path off a GPU, in the scales' dtype, nothing cached
    w16 = block.soarpack_marlin_dequant(marlin_q, marlin_s, k, n, bits)
    assert w16.dtype == torch.bfloat16 and torch.equal(w16, want.to(torch.bfloat16))
    x = torch.randn(5, k, dtype=torch.bfloat16)
    out = block.soarpack_w4_gemm(x, marlin_q, marlin_s, None, None, None, None, 0, bits, n, k, True, False, True,
                                 route="dequant")
    ref = x.float() @ want.t()
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2


def test_a_failing_dequantize_route_falls_back_to_marlin_once_and_for_all(block, monkeypatch, caplog):
    """A Triton build the platform's GPU refuses must cost speed, not the request: Marlin from then on, logged once."""
    import types

    calls = []

    def marlin(x, *args):
        calls.append(x.shape[0])
        return torch.zeros(x.shape[0], 320, dtype=x.dtype)

    def refused(*args, **kwargs):
        raise RuntimeError("PTX .version 8.8 does not support .target sm_120a")

    stub_torch = types.SimpleNamespace(ops=types.SimpleNamespace(sgl_kernel=types.SimpleNamespace(gptq_marlin_gemm=marlin)),
                                       nn=torch.nn)
    monkeypatch.setattr(block, "_sp_torch", stub_torch)
    monkeypatch.setattr(block, "soarpack_marlin_dequant", refused)
    monkeypatch.setattr(block, "SOARPACK_W4_DEQUANT_FAILED", [])
    x = torch.randn(4096, 384, dtype=torch.bfloat16)
    with caplog.at_level("WARNING", logger="sglang.soarpack"):
        first = block.soarpack_w4_gemm(x, None, None, None, None, None, None, 0, 4, 320, 384, True, False, True,
                                       route="dequant")
        again = block.soarpack_w4_gemm(x, None, None, None, None, None, None, 0, 4, 320, 384, True, False, True,
                                       route="dequant")
    assert first.shape == again.shape == (4096, 320) and calls == [4096, 4096]
    assert block.SOARPACK_W4_DEQUANT_FAILED == ["RuntimeError: PTX .version 8.8 does not support .target sm_120a"]
    warnings = [r.getMessage() for r in caplog.records if "dequantize route failed" in r.getMessage()]
    assert len(warnings) == 1 and "Marlin serves every M" in warnings[0]


def test_the_dispatch_takes_only_symmetric_group128_layers(block):
    empty = torch.empty(0, dtype=torch.int32)
    s = torch.ones(32, 4096, dtype=torch.bfloat16)
    assert block.soarpack_w4_dispatch_applies(empty, empty, s, 4, 4096, 4096)
    assert not block.soarpack_w4_dispatch_applies(torch.ones(3, dtype=torch.int32), empty, s, 4, 4096, 4096)  # zp
    assert not block.soarpack_w4_dispatch_applies(empty, torch.arange(4096), s, 4, 4096, 4096)  # act order
    assert not block.soarpack_w4_dispatch_applies(empty, empty, torch.ones(1, 4096, dtype=torch.bfloat16), 4, 4096, 4096)
    assert not block.soarpack_w4_dispatch_applies(empty, empty, s, 3, 4096, 4096)


def test_profile_fast_lints_clean_and_the_default_adds_only_patch_06_to_it():
    fast, safe = load_profile("fast"), load_profile("safe")
    assert fast.patches == ["w4-dispatch"] and fast.fallback == "safe"
    assert safe.patches == [] and "w4-dispatch" not in safe.patches
    assert fast.args == safe.args  # the dispatch is the only difference
    assert lint_args(fast.args, recipe=fast.recipe, patched=set(fast.patches)) == []
    from soarpack._toml import loads
    from soarpack.evidence import Evidence

    from soarpack.recipe.profile import DEFAULT_PROFILE

    default = load_profile(DEFAULT_PROFILE)  # fast-gla (issue 38): the same server, plus the in-place Lightning decode
    assert (default.name, default.args, default.recipe, default.fallback) == ("fast-gla", fast.args, fast.recipe, "safe")
    assert default.patches == fast.patches + ["gla-decode-in-place"]
    raw = loads(Path(fast.source).read_text())
    none, served, peers = [Evidence(**e) for e in raw["evidence"]]
    assert none.kind == "none" and "nothing measured on a server with this profile's sparse backend" in none.summary
    assert "sm_120" in none.risk and "sparse backend" in none.risk  # check shows what is unmeasured, as a risk
    # the served measurements were the dense variant, and the peers' run was safe's: related, never this profile's
    assert served.kind == "soarpack" and served.relation == "related" and "dense variant" in served.summary
    assert peers.kind == "platform" and peers.relation == "related" and peers.acc_ori == 82.18
