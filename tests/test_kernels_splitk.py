"""The split-K W4A16 decode kernel (soarpack/kernels/w4_splitk.py) against soarpack's dequantization.

Its layout arithmetic is checked in plain torch against patch 04's reference of Marlin's layout; the kernel itself
runs under Triton's CPU interpreter (TRITON_INTERPRET=1) when triton is importable, with fp16 and fp32 activations.
bf16 activations cannot be checked here: Triton 3.9.0's interpreter computes tl.dot of bf16 operands wrongly on the
CPU (a plain 16x16 bf16 dot is off by ~1e10), so the bf16 numerics are the device run's (soarpack kernels *_err).
"""

from __future__ import annotations

import os

import pytest

import torch  # noqa: E402  (conftest.NEEDS_TORCH lists this file)

if not torch.cuda.is_available():  # read when a kernel is decorated, so before anything imports the kernel module
    os.environ.setdefault("TRITON_INTERPRET", "1")

from soarpack.kernels.block import load_dispatch_block  # noqa: E402
from soarpack.quant.gptq_format import dequantize, pack_cols, pack_rows  # noqa: E402


@pytest.fixture(scope="module")
def block():
    return load_dispatch_block(dispatch="")


def _layer(block, k, n, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    scales = (torch.rand(k // 128, n, generator=gen) * 0.02 + 0.002).to(torch.bfloat16).to(torch.float16)
    qzeros = pack_cols(torch.full((k // 128, n), 7, dtype=torch.int32), 4)
    w = dequantize(pack_rows(q, 4), qzeros, scales, None, 4, 128)  # fp32 [n, k]
    marlin_q = block.soarpack_marlin_reference_repack(q, 4)
    perm = torch.tensor(block._sp_scale_perm())
    marlin_s = scales.to(torch.bfloat16).reshape(-1, 64)[:, perm].reshape(-1, n)
    return q, w, marlin_q, marlin_s


def test_the_kernels_word_and_nibble_formula_is_marlins_layout(block):
    """Word 16*a + 4*bk + bn of tile (kr, tn), nibble j holds q[16*kr + (j>>2) + 2*bk + 8*(j&1), 64*tn + a +
    8*((j>>1)&1) + 16*bn]: the docstring's closed form, against the patch's reference repack."""
    k, n = 256, 192
    q, _, marlin_q, _ = _layer(block, k, n, seed=1)
    kr, tn, a, bk, bn, j = torch.meshgrid(*(torch.arange(s) for s in (k // 16, n // 64, 8, 4, 4, 8)), indexing="ij")
    words = marlin_q[kr, tn * 128 + 16 * a + 4 * bk + bn]
    nib = (words >> (4 * j)) & 15
    kk = 16 * kr + (j >> 2) + 2 * bk + 8 * (j & 1)
    nn = 64 * tn + a + 8 * ((j >> 1) & 1) + 16 * bn
    assert torch.equal(nib, q[kk, nn])
    assert sorted(zip(kk.flatten().tolist(), nn.flatten().tolist())) == [(x, y) for x in range(k) for y in range(n)]


def test_the_inverse_scale_permutation_is_the_patchs(block):
    from soarpack.kernels.w4_splitk import _inverse_scale_perm

    assert _inverse_scale_perm() == block._sp_inverse(block._sp_scale_perm())


@pytest.fixture(scope="module")
def splitk():
    pytest.importorskip("triton", reason="triton is not installed (pip install triton; it pulls no torch)")
    import soarpack.kernels.w4_splitk as mod

    return mod


# bf16 only on a GPU: the CPU interpreter's bf16 tl.dot is wrong (module docstring)
DTYPES = [torch.float16, torch.float32] + ([torch.bfloat16] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,config", [(1, (64, 1, 4)), (3, (64, 2, 4)), (16, (128, 4, 4)), (7, None),
                                      (2, (64, 1, 4, 1)), (16, (128, 2, 4, 1))])
def test_splitk_matches_soarpacks_dequantization(block, splitk, dtype, m, config):
    k, n = 512, 256
    _, w, marlin_q, marlin_s = _layer(block, k, n, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(10 + m)).to(dtype)
    s = marlin_s.float() if dtype == torch.float32 else marlin_s
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = splitk.w4_splitk_gemm(x.to(dev), marlin_q.to(dev), s.to(dev), n, k, config=config).cpu()
    assert out.shape == (m, n) and out.dtype == dtype
    ref = x.float() @ w.t()
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < {torch.float16: 1e-3, torch.float32: 1e-6, torch.bfloat16: 5e-3}[dtype], err
    if dtype == torch.float32:
        return
    # at least as close as the dequantize route of patch 04 (weight rounded to the activations' dtype first)
    deq = (x.float() @ w.to(dtype).float().t()).to(dtype).float()
    assert err <= ((deq - ref).norm() / ref.norm()).item() * 1.05


def test_splitk_refuses_what_it_does_not_take(block, splitk):
    assert splitk.supports(16, 4096, 4096, 4) and not splitk.supports(17, 4096, 4096, 4)
    assert not splitk.supports(1, 4096, 4096, 8) and not splitk.supports(1, 4096 + 32, 4096, 4)
    _, _, marlin_q, marlin_s = _layer(block, 256, 128, seed=0)
    with pytest.raises(ValueError, match="M <= 16"):
        splitk.w4_splitk_gemm(torch.zeros(17, 256, dtype=torch.float16), marlin_q, marlin_s, 128, 256)
    with pytest.raises(ValueError, match="split_k 4 does not divide"):
        splitk.w4_splitk_gemm(torch.zeros(1, 256, dtype=torch.float16), marlin_q, marlin_s, 128, 256, config=(64, 4, 4))


def test_default_config_splits_k_into_whole_groups(splitk):
    for n, k in ((4096, 4096), (4608, 4096), (12288, 4096), (32768, 4096), (4096, 16384)):
        bn, split, _, _ = splitk.default_config(n, k)
        assert n % bn == 0 and (k // 128) % split == 0
        assert (n // bn) * split >= 132 or split == k // 128 or (n // bn) * split * 2 > 2 * 132


def test_the_benchmark_renders_the_decode_kernels_table():
    """benchmarks/gpu_w4_dispatch.py --render: the split-K table (µs, ratio to floor, to Marlin, to bf16) from the
    row fields the benchmark writes; a result without them renders as before."""
    import json
    import sys
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench_dir))
    import gpu_w4_dispatch as B

    res = json.loads((bench_dir / "results" / "w4_dispatch_2026-12-01.json").read_text())
    assert "split-K" not in B.render_markdown(res)
    row = next(r for r in res["rows"] if r["class"] == "gate_up" and r["bits"] == 4 and r["M"] == 1)
    row.update({"splitk_us": 20.0, "splitk_err": 2.0e-3, "splitk_config": [128, 2, 4],
                "splitk 128,4,4_us": 18.5, "splitk 64,-,4_us": 25.0})
    for rt in ("splitk",):
        row[f"{rt}_vs_floor"] = row[f"{rt}_us"] / row["read_floor_us"]
        row[f"{rt}_vs_bf16"] = row[f"{rt}_us"] / row["bf16_us"]
    row["splitk_vs_marlin"] = row["splitk_us"] / row["marlin_us"]
    lines = [ln for ln in B.render_markdown(res).splitlines() if ln.startswith("| 32768x4096 (gate_up) | 1 |")]
    assert len(lines) == 1
    cells = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert cells[5] == "20.0" and cells[6] == f"{20.0 / row['read_floor_us']:.2f}"
    assert cells[7] == f"{20.0 / row['marlin_us']:.2f}" and cells[8] == f"{20.0 / row['bf16_us']:.2f}"
    assert cells[-1] == "128,4,4: 18.5"


def test_the_benchmark_compares_soarpack_kernels_with_its_own_rows():
    import json
    import sys
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench_dir))
    import gpu_w4_dispatch as B

    bench = json.loads((bench_dir / "results" / "w4_dispatch_2026-12-01.json").read_text())
    rows = [dict(r, bf16_us=r["bf16_us"] * 1.1, marlin_us=r["marlin_us"] * (0.9 if r["M"] == 1 else 1.0))
            for r in bench["rows"] if r["bits"] == 4]
    out = B.compare_kernels(bench, {"rows": rows})
    n = len(rows)
    assert out["bf16"] == pytest.approx((1.1, 1.1, 1.1, n)) and out["dequant"] == pytest.approx((1.0, 1.0, 1.0, n))
    assert out["marlin"][0] == pytest.approx(0.9) and out["marlin"][1:] == pytest.approx((1.0, 1.0, n))
    assert "splitk" not in out


def test_the_benchmarks_rollup_is_the_librarys_and_reproduces_the_h200_run():
    """The roll-up of §5 was summed from a hard-coded layer composition; the library's, from the recipes' own
    plans, gives the same totals from the same rows (Marlin only and with the dispatch, every recipe and step)."""
    import json
    import sys
    from pathlib import Path

    bench_dir = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench_dir))
    import gpu_w4_dispatch as B

    res = json.loads((bench_dir / "results" / "w4_dispatch_2026-12-01.json").read_text())
    stored = {(r["recipe"], r["M"]): r for r in res["rollup"]}
    new = {(r["recipe"], r["M"]): r for r in B.rollup(res["rows"])}
    # Every recipe and step of the H200 run, and those of recipes added since, summed from the same rows.
    since = {"w4-mlp-w8-attn"}
    assert set(stored) == {key for key in new if key[0] not in since}
    assert {recipe for recipe, _ in new} - {recipe for recipe, _ in stored} == since
    for key, r in stored.items():
        assert new[key]["marlin_ms"] == pytest.approx(r["marlin_ms"], rel=1e-9), key
        assert new[key]["dispatch_ms"] == pytest.approx(r["dispatch_ms"], rel=1e-9), key
        assert new[key]["floor_ms"] < new[key]["best_ms"] <= new[key]["marlin_ms"] * (1 + 1e-9)
