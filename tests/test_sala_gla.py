"""The Lightning recurrence: chunked form == step-by-step recurrence == a float64 loop written from the formula."""

import pytest
import torch

from soarpack.sala import gla
from soarpack.sala.config import alibi_slopes


def naive_gla(q, k, v, g, scale):
    """S_t = exp(g)·S_{t-1} + k_tᵀ v_t; o_t = scale · q_t S_t, per batch and head, in float64."""
    B, T, H, D = q.shape
    out = torch.zeros(B, T, H, v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(D, v.shape[-1], dtype=torch.float64)
            for t in range(T):
                S = torch.exp(g[h]) * S + torch.outer(k[b, t, h], v[b, t, h])
                out[b, t, h] = scale * q[b, t, h] @ S
    return out, S


def rand_qkv(B, T, H, D, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, H, D, generator=gen, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 130, 200])
def test_chunked_equals_recurrent_and_naive(T):
    H, D = 3, 8
    q, k, v = rand_qkv(1, T, H, D, seed=T)
    g = -torch.tensor(alibi_slopes(H), dtype=torch.float64)
    o_chunk, s_chunk = gla.chunk_gla(q, k, v, g, D**-0.5)
    o_rec, s_rec = gla.recurrent_gla(q, k, v, g, D**-0.5)
    if T <= 65:  # the python loop is slow; the two vectorised forms are compared at every length
        o_ref, _ = naive_gla(q, k, v, g, D**-0.5)
        torch.testing.assert_close(o_rec, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(o_chunk, o_rec, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_chunk, s_rec, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("chunk", [7, 16, 64])
@pytest.mark.parametrize("segment", [None, 20, 64])
def test_chunk_and_segment_sizes_do_not_change_result(chunk, segment):
    q, k, v = rand_qkv(2, 150, 2, 4, seed=1)
    g = -torch.tensor([0.3, 0.9], dtype=torch.float64)
    ref, s_ref = gla.recurrent_gla(q, k, v, g, 0.5)
    out, s_out = gla.chunk_gla(q, k, v, g, 0.5, chunk_size=chunk, segment_len=segment)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_out, s_ref, rtol=1e-10, atol=1e-10)


def test_carried_state_continues_the_sequence():
    q, k, v = rand_qkv(1, 90, 2, 8, seed=2)
    g = -torch.tensor(alibi_slopes(2), dtype=torch.float64)
    full, s_full = gla.chunk_gla(q, k, v, g, 0.3)
    first, state = gla.chunk_gla(q[:, :70], k[:, :70], v[:, :70], g, 0.3)
    rest, s_rest = gla.recurrent_gla(q[:, 70:], k[:, 70:], v[:, 70:], g, 0.3, initial_state=state)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_rest, s_full, rtol=1e-10, atol=1e-10)


def test_a_wrong_decay_is_detected():
    """Guard against a test that cannot fail: a different slope changes the output."""
    q, k, v = rand_qkv(1, 40, 2, 4, seed=3)
    g = -torch.tensor([0.5, 0.25], dtype=torch.float64)
    a, _ = gla.chunk_gla(q, k, v, g, 1.0)
    b, _ = gla.chunk_gla(q, k, v, g * 1.01, 1.0)
    assert (a - b).abs().max() > 1e-4


def test_backend_switch():
    previous = gla.set_backend("torch")
    try:
        q, k, v = rand_qkv(1, 10, 2, 4, dtype=torch.float32)
        g = -torch.tensor([0.5, 0.25])
        out, _ = gla.gla(q, k, v, g, 1.0)
        ref, _ = gla.chunk_gla(q, k, v, g, 1.0)
        torch.testing.assert_close(out, ref)
        with pytest.raises(ValueError):
            gla.set_backend("cuda-magic")
        if not gla.fla_available():
            gla.set_backend("fla")
            with pytest.raises(RuntimeError, match="fla"):
                gla.gla(q, k, v, g, 1.0)
    finally:
        gla.set_backend(previous)


@pytest.mark.skipif(not (torch.cuda.is_available() and gla.fla_available()), reason="needs CUDA and fla (GPU check: issue 7)")
def test_fla_matches_torch_on_cuda():
    q, k, v = (x.cuda() for x in rand_qkv(1, 300, 4, 64, dtype=torch.float32))
    g = -torch.tensor(alibi_slopes(4), device="cuda")
    previous = gla.set_backend("fla")
    try:
        out_fla, s_fla = gla.gla(q, k, v, g, 0.125)
    finally:
        gla.set_backend("torch")
    out_t, s_t = gla.gla(q, k, v, g, 0.125)
    gla.set_backend(previous)
    torch.testing.assert_close(out_fla, out_t, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(s_fla, s_t, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("split", [1, 37, 64, 70])
def test_chunked_prefill_continues_from_a_carried_state(split):
    """A prefill with an initial state (a second turn after a cached first one) equals the whole sequence at once."""
    q, k, v = rand_qkv(2, 150, 3, 8, seed=4)
    g = -torch.tensor(alibi_slopes(3), dtype=torch.float64)
    full, s_full = gla.recurrent_gla(q, k, v, g, 0.4)
    _, state = gla.chunk_gla(q[:, :split], k[:, :split], v[:, :split], g, 0.4)
    rest, s_rest = gla.chunk_gla(q[:, split:], k[:, split:], v[:, split:], g, 0.4, initial_state=state)
    torch.testing.assert_close(rest, full[:, split:], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_rest, s_full, rtol=1e-10, atol=1e-10)
