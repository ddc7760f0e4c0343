"""The GPTQ v1 layout and the qzeros question of SALA.md §4, settled by dequantization."""

from __future__ import annotations

import torch

from soarpack.quant.gptq_format import dequantize, pack_cols, pack_rows, rtn_on_grid, unpack_cols, unpack_rows


def make_module(out_f=128, in_f=256, group=128, bits=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 1 << bits, (in_f, out_f), generator=g, dtype=torch.int32)
    scales = (torch.rand(in_f // group, out_f, generator=g) * 0.01 + 1e-3).to(torch.float16)
    zeros = torch.full((in_f // group, out_f), (1 << (bits - 1)) - 1, dtype=torch.int32)  # v1: zero - 1
    g_idx = (torch.arange(in_f) // group).to(torch.int32)
    return q, pack_rows(q, bits), pack_cols(zeros, bits), scales, g_idx


def test_pack_unpack_round_trip_and_bit_order():
    vals = torch.tensor([[1], [2], [3], [4], [5], [6], [7], [15]], dtype=torch.int32)
    packed = pack_rows(vals, 4)
    assert packed.shape == (1, 1) and (packed.item() & 0xFFFFFFFF) == 0xF7654321  # lowest bits first
    assert torch.equal(unpack_rows(packed, 4), vals)
    z = torch.randint(0, 256, (3, 8), dtype=torch.int32)
    assert torch.equal(unpack_cols(pack_cols(z, 8), 8), z)


def test_sym_v1_zeros_are_0x77777777_and_read_like_marlin():
    q, qweight, qzeros, scales, g_idx = make_module()
    assert ((qzeros & 0xFFFFFFFF) == 0x77777777).all()
    v1 = dequantize(qweight, qzeros, scales, g_idx, 4, 128)
    marlin = dequantize(qweight, qzeros, scales, g_idx, 4, 128, marlin=True)
    assert torch.equal(v1, marlin)
    expect = ((q - 8).float() * scales.float()[g_idx.long()]).t()
    assert torch.equal(v1, expect)


def test_rewriting_zeros_to_0x88888888_only_shifts_the_v1_reading():
    # The peer's "fix": Marlin (sym) ignores qzeros, so its reading is unchanged; a v1 reader is now off by one step.
    q, qweight, qzeros, scales, g_idx = make_module(seed=1)
    zeros88 = pack_cols(torch.full((2, 128), 8, dtype=torch.int32), 4)
    assert ((zeros88 & 0xFFFFFFFF) == 0x88888888).all()
    marlin_before = dequantize(qweight, qzeros, scales, g_idx, 4, 128, marlin=True)
    marlin_after = dequantize(qweight, zeros88, scales, g_idx, 4, 128, marlin=True)
    v1_after = dequantize(qweight, zeros88, scales, g_idx, 4, 128)
    assert torch.equal(marlin_before, marlin_after)
    step = scales.float()[g_idx.long()].t()
    assert torch.allclose(marlin_after - v1_after, step)


def test_rtn_on_grid_matches_the_grid():
    w = torch.randn(64, 256)
    scales = (w.t().reshape(2, 128, 64).abs().amax(1) / 7).to(torch.float16)
    r = rtn_on_grid(w, scales, 4, 128)
    s = scales.float()[torch.arange(256) // 128].t()
    levels = r / s
    assert torch.allclose(levels, levels.round(), atol=1e-4)
    assert levels.min() >= -8 and levels.max() <= 7
    assert (r - w).abs().max() <= (s / 2 + 1e-6).max() * 1.01 + (w.abs() - 7 * s).clamp(min=0).max()
