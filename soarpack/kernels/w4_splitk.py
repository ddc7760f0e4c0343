"""A W4A16 decode GEMM of our own (M <= 16), split over K, on Marlin's weight layout: the layout patch
04-w4-dispatch keeps (the repacked qweight [size_k/16, size_n*2] and the permuted bf16 scales [groups, size_n]).

Self-contained (torch and triton only), so the block of patch 04 can take it as a third route where it wins; it is
NOT routed anywhere yet: `soarpack kernels` and benchmarks/gpu_w4_dispatch.py time it beside Marlin first.

Why it can be fast at decode sizes: it reads every packed word once (no un-permuting gather). In one 16x64 Marlin
tile, word 16*a + 4*bk + bn (a, bk, bn < 8, 4, 4) holds nibble j of the weight at
    n = 64*tile_n + a + 8*((j >> 1) & 1) + 16*bn,    k = 16*tile_k + (j >> 2) + 2*bk + 8*(j & 1)
(the closed form of the patch's `_sp_marlin_dequant_kernel`, inverted). So a [BK/4, BN/2] block of words, loaded
with plain strides, gives for each of the 8 nibbles a [BK/4, BN/2] matrix of weights; the x rows they multiply are
a strided [BM, BK/4] slice of x. Eight tensor-core dots per group of 128 k, the group's scale applied to the fp32
partial sums, then each K split writes fp32 partials that a second kernel sums and rounds to bf16 once.

Numerics: out = sum over groups of s_g * (x . (q - 8)) in fp32, then bf16; the weight is never rounded to bf16
(the dequantize route rounds s * (q - 8) to bf16 first), so it is at least as close to the fp32 product.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only environments without triton
    triton = None

GROUP = 128
MAX_M = 16
BM = 16  # rows of x per program: tl.dot needs 16; M < 16 is padded by masking


def _inverse_scale_perm() -> list:
    """Where marlin_permute_scales put column c of a 64-column block: position inv[c] (the patch's _sp_scale_perm
    inverted)."""
    perm = [i + 8 * j for i in range(8) for j in range(8)]
    inv = [0] * 64
    for pos, c in enumerate(perm):
        inv[c] = pos
    return inv


if triton is not None:

    @triton.jit
    def _w4_splitk_kernel(X, B, S, INV_S, P, M, size_n, size_k, b_stride, k_per_split,
                          BN: tl.constexpr, BK: tl.constexpr, BMc: tl.constexpr, DIRECT: tl.constexpr,
                          CONTIGUOUS: tl.constexpr, PRECISION: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        HN: tl.constexpr = BN // 2
        QK: tl.constexpr = BK // 4
        # word-column index nw -> (tile_n, a, bn); output column of nibble-half jn: n0 + 8*jn
        nw = tl.arange(0, HN)
        tile_n = pid_n * (BN // 64) + nw // 32
        a = (nw % 32) // 4
        bn = nw % 4
        word_n = tile_n * 128 + 16 * a + bn
        n0 = tile_n * 64 + a + 16 * bn
        # word-row index kw -> (tile_k, bk) within one BK step
        kw = tl.arange(0, QK)
        kr = kw // 4
        bk = kw % 4
        m = tl.arange(0, BMc)
        m_ok = m < M
        inv0 = tl.load(INV_S + n0 % 64)
        inv1 = tl.load(INV_S + (n0 + 8) % 64)
        acc0 = tl.zeros((BMc, HN), dtype=tl.float32)
        acc1 = tl.zeros((BMc, HN), dtype=tl.float32)
        k_begin = pid_k * k_per_split
        for k0 in range(k_begin, k_begin + k_per_split, BK):
            if CONTIGUOUS:  # the BK/16 packed rows as they lie (coalesced), then Marlin's order undone in registers
                rows = tl.arange(0, BK // 16)
                cols = pid_n * (BN * 2) + tl.arange(0, BN * 2)
                raw = tl.load(B + (k0 // 16 + rows)[:, None] * b_stride + cols[None, :])  # [BK/16, 2*BN]
                raw = tl.reshape(raw, (BK // 16, BN // 64, 8, 4, 4))  # (kr, tile_n, a, bk, bn)
                words = tl.reshape(tl.permute(raw, (0, 3, 1, 2, 4)), (QK, HN))  # (kr, bk) x (tile_n, a, bn)
            else:  # one strided gather: each word once, straight into (kr, bk) x (tile_n, a, bn)
                words = tl.load(B + ((k0 // 16 + kr) * b_stride + 4 * bk)[:, None] + word_n[None, :])  # [QK, HN]
            kbase = k0 + 16 * kr + 2 * bk
            part0 = tl.zeros((BMc, HN), dtype=tl.float32)
            part1 = tl.zeros((BMc, HN), dtype=tl.float32)
            for j in tl.static_range(8):
                q = ((words >> (4 * j)) & 15) - 8
                kk = kbase + (j >> 2) + 8 * (j & 1)
                xs = tl.load(X + m[:, None] * size_k + kk[None, :], mask=m_ok[:, None], other=0.0)  # [BMc, QK]
                d = tl.dot(xs, q.to(xs.dtype), out_dtype=tl.float32, input_precision=PRECISION)
                if (j >> 1) & 1:
                    part1 += d
                else:
                    part0 += d
            g = k0 // BK  # BK is the group
            s0 = tl.load(S + g * size_n + (n0 // 64) * 64 + inv0).to(tl.float32)
            s1 = tl.load(S + g * size_n + ((n0 + 8) // 64) * 64 + inv1).to(tl.float32)
            acc0 += part0 * s0[None, :]
            acc1 += part1 * s1[None, :]
        if DIRECT:
            out_ptr = P + m[:, None] * size_n
            tl.store(out_ptr + n0[None, :], acc0.to(P.dtype.element_ty), mask=m_ok[:, None])
            tl.store(out_ptr + (n0 + 8)[None, :], acc1.to(P.dtype.element_ty), mask=m_ok[:, None])
        else:
            out_ptr = P + pid_k * M * size_n + m[:, None] * size_n
            tl.store(out_ptr + n0[None, :], acc0, mask=m_ok[:, None])
            tl.store(out_ptr + (n0 + 8)[None, :], acc1, mask=m_ok[:, None])

    @triton.jit
    def _sum_splits_kernel(P, OUT, total, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = i < total
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            acc += tl.load(P + s * total + i, mask=ok, other=0.0)
        tl.store(OUT + i, acc.to(OUT.dtype.element_ty), mask=ok)


_INV_S = {}


def _inv_s(device) -> torch.Tensor:
    key = str(device)
    if key not in _INV_S:
        _INV_S[key] = torch.tensor(_inverse_scale_perm(), dtype=torch.int32, device=device)
    return _INV_S[key]


def supports(m: int, size_n: int, size_k: int, num_bits: int, group_size: int = GROUP) -> bool:
    """The calls this kernel takes: W4, group 128, M <= 16, size_n % 64 == 0, size_k % 128 == 0."""
    return (triton is not None and num_bits == 4 and group_size == GROUP and 1 <= m <= MAX_M
            and size_n % 64 == 0 and size_k % GROUP == 0)


def default_config(size_n: int, size_k: int, sms: int = 132) -> Tuple[int, int, int, int]:
    """(BN, split_k, num_warps, contiguous): about two programs per SM, each K split a whole number of groups.
    A starting point only; the device run sweeps SPLITK_CONFIGS."""
    bn = 128 if size_n % 128 == 0 else 64
    blocks = size_n // bn
    groups = size_k // GROUP
    split = 1
    while blocks * split < 2 * sms and split * 2 <= groups and groups % (split * 2) == 0:
        split *= 2
    return bn, split, 4, 0


# (BN, split or None for default_config's, warps, contiguous load 0/1): what --splitk-sweep times
SPLITK_CONFIGS = ((64, None, 4, 0), (128, None, 4, 0), (128, 1, 4, 0), (128, 2, 4, 0), (128, 4, 4, 0),
                  (128, 8, 4, 0), (256, None, 8, 0), (128, None, 8, 0),
                  (64, None, 4, 1), (128, None, 4, 1), (128, 4, 4, 1), (256, None, 8, 1))


def w4_splitk_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, size_n: int, size_k: int,
                   config: Optional[tuple] = None) -> torch.Tensor:
    """x [M, size_k] (bf16/fp16, M <= 16) @ W.T from Marlin's layout -> [M, size_n] in x's dtype.
    `config`: (BN, split_k or None, num_warps[, contiguous]); default_config's when None."""
    if triton is None:
        raise RuntimeError("the split-K W4 kernel needs triton")
    m = x.shape[0]
    if not supports(m, size_n, size_k, 4):
        raise ValueError(f"w4_splitk_gemm takes W4 g128 with M <= {MAX_M}, size_n % 64, size_k % 128; "
                         f"got M={m}, {size_n}x{size_k}")
    x = x.contiguous()
    bn, split, warps, contiguous = default_config(size_n, size_k)
    if config is not None:
        bn, split, warps = config[0], config[1] or default_config(size_n, size_k)[1], config[2]
        contiguous = int(config[3]) if len(config) > 3 else 0
    if size_n % bn:
        raise ValueError(f"BN {bn} does not divide size_n {size_n}")
    groups = size_k // GROUP
    if groups % split:
        raise ValueError(f"split_k {split} does not divide the {groups} groups of size_k {size_k}")
    out = torch.empty((m, size_n), dtype=x.dtype, device=x.device)
    direct = split == 1
    partials = out if direct else torch.empty((split, m, size_n), dtype=torch.float32, device=x.device)
    _w4_splitk_kernel[(size_n // bn, split)](
        x, weight, weight_scale, _inv_s(x.device), partials, m, size_n, size_k, weight.stride(0),
        size_k // split, BN=bn, BK=GROUP, BMc=BM, DIRECT=direct, CONTIGUOUS=bool(contiguous),
        # fp32 activations: exact products (a GPU's default for fp32 dots is TF32); bf16/fp16 ignore it
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps)
    if not direct:
        total = m * size_n
        block = 1024
        _sum_splits_kernel[(triton.cdiv(total, block),)](partials, out, total, SPLIT=split, BLOCK=block)
    return out
