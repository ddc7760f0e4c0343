"""The GPTQ v1 layout and the qzeros question of SALA.md §4, settled by dequantization."""

from __future__ import annotations

import pytest
import torch

from soarpack.quant.gptq_format import dequantize, pack_cols, pack_rows, rtn_on_grid, unpack_cols, unpack_rows


def gptqmodel_reading(qweight, qzeros, scales, g_idx, bits=4, group=128):
    """The weight as GPTQModel itself reads a GPTQ v1 module ([out, in], float): its torch kernel's dequantization
    after its own v1 → v2 conversion. An independent reader for soarpack's model of the format."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module

    in_f, out_f = g_idx.shape[0], scales.shape[1]
    module = TorchLinear(bits=bits, group_size=group, sym=True, desc_act=False, in_features=in_f, out_features=out_f)
    for name, value in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales), ("g_idx", g_idx)):
        getattr(module, name).copy_(value)
    convert_gptq_v1_to_v2_format_module(module.eval(), bits, torch.int32)
    return module.dequantize_weight().t().float()


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
    # GPTQModel computes in float16: equal up to its rounding.
    assert torch.allclose(gptqmodel_reading(qweight, qzeros, scales, g_idx), v1, rtol=1e-3, atol=0)


@pytest.mark.parametrize("bits", [4, 8])
def test_v1_reading_of_arbitrary_zeros_agrees_with_gptqmodel(bits):
    q, qweight, _, scales, g_idx = make_module(bits=bits, seed=2)
    zeros = torch.randint(0, (1 << bits) - 1, (2, 128), generator=torch.Generator().manual_seed(3), dtype=torch.int32)
    qzeros = pack_cols(zeros, bits)
    ours = dequantize(qweight, qzeros, scales, g_idx, bits, 128)
    assert torch.allclose(gptqmodel_reading(qweight, qzeros, scales, g_idx, bits), ours, rtol=1e-3, atol=1e-6)


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
