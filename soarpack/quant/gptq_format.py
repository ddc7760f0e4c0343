"""The GPTQ (v1) tensor layout on disk, read back in plain PyTorch.

Per quantized linear `W [out, in]` with `bits` b, pack factor p = 32 / b, `groups = in / group_size`:
  qweight [in / p, out]    int32, p input rows per int32, lowest bits first
  qzeros  [groups, out / p] int32, p output columns per int32; **v1 stores zero − 1** (so 0x77777777 for sym 4-bit)
  scales  [groups, out]    float16
  g_idx   [in]             int32, the group of each input row (i // group_size when desc_act is false)
  W[o, i] = (q[i, o] − (z[g_idx[i], o] + 1)) · s[g_idx[i], o]

`gptq_marlin` with sym = true ignores qzeros and uses the fixed zero 2^(b−1): `W = (q − 8) · s` for 4 bits. The two
agree exactly when every stored zero is 2^(b−1) − 1, which is what GPTQModel writes for sym; `dequantize(...,
marlin=True)` computes the Marlin reading so a test can compare both (SALA.md §4, the qzeros question).
"""

from __future__ import annotations

from typing import Optional

import torch


QUANT_PARTS = ("qweight", "qzeros", "scales", "g_idx")  # a GPTQ module's tensors, `{module}.{part}`


def unpack_rows(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[n / p, m] int32 -> [n, m] int32 values, p = 32 / bits values per int32 along dim 0, lowest bits first."""
    p = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=packed.device)  # [p]
    vals = (packed.unsqueeze(1) >> shifts.view(1, p, 1)) & ((1 << bits) - 1)  # [n/p, p, m]
    return vals.reshape(packed.shape[0] * p, packed.shape[1])


def unpack_cols(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """[n, m / p] int32 -> [n, m] int32 values, packed along dim 1."""
    return unpack_rows(packed.t().contiguous(), bits).t().contiguous()


def pack_rows(vals: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of unpack_rows (used by tests to build tampered checkpoints)."""
    p = 32 // bits
    v = vals.to(torch.int64).reshape(vals.shape[0] // p, p, vals.shape[1])
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=vals.device).view(1, p, 1)
    out = (v << shifts).sum(dim=1)
    out = torch.where(out >= 2**31, out - 2**32, out)
    return out.to(torch.int32)


def pack_cols(vals: torch.Tensor, bits: int) -> torch.Tensor:
    return pack_rows(vals.t().contiguous(), bits).t().contiguous()


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: Optional[torch.Tensor],
               bits: int, group_size: int, *, marlin: bool = False, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [out, in] a GPTQ v1 module stands for (`marlin=True`: as gptq_marlin sym reads it)."""
    q = unpack_rows(qweight, bits)  # [in, out]
    in_f = q.shape[0]
    if g_idx is None:
        g = torch.arange(in_f, device=q.device) // (group_size if group_size > 0 else in_f)
    else:
        g = g_idx.to(torch.long)
    s = scales.to(torch.float32)[g]  # [in, out]
    if marlin:
        z = torch.full_like(q, 1 << (bits - 1))
    else:
        z = unpack_cols(qzeros, bits)[g] + 1
    return ((q - z).to(torch.float32) * s).t().contiguous().to(dtype)


def rtn_on_grid(weight: torch.Tensor, scales: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """Round-to-nearest of `weight` [out, in] onto the given symmetric grid (same scales, zero 2^(b−1))."""
    w = weight.to(torch.float32).t()  # [in, out]
    g = torch.arange(w.shape[0]) // (group_size if group_size > 0 else w.shape[0])
    s = scales.to(torch.float32)[g]
    half = 1 << (bits - 1)
    q = torch.clamp(torch.round(w / s) + half, 0, (1 << bits) - 1)
    return ((q - half) * s).t().contiguous()
