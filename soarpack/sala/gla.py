"""Simple gated linear attention (scalar decay per head), the recurrence of SALA's Lightning layers.

For every head h with log-decay g_h = -slope_h (a constant):

    S_t = exp(g_h) · S_{t-1} + k_tᵀ v_t          S: [d_k, d_v]
    o_t = scale · q_t S_t

Two exact forms of the same recurrence:
- `chunk_gla`: prefill. Within a chunk of C tokens the intra-chunk part is a masked, decayed q·kᵀ product; the
  state carries everything before the chunk. O(T·C·d + T·d²).
- `recurrent_gla`: decode, one token at a time, carrying the [heads, d_k, d_v] state.

`gla` runs the torch forms ("torch", the default) unless fla's `fla.ops.simple_gla` kernels (Triton) are asked for
with `set_backend("fla")` or SOARPACK_GLA_BACKEND=fla. The torch path is the default since the chunk form stopped
looping over the sequence: on an H200 a calibration forward's GLA (320k tokens) takes 0.12 s, 3.4× fla's compiled kernel, with no
Triton compile and autotune to wait for (about 50 s cold, every platform run) and no dependence on the image's fla
version (benchmarks/RESULTS.md §1, §2).
Shapes follow fla: q, k, v are [B, T, H, D]; states are [B, H, D_k, D_v]; all math here is in float32 or float64,
the dtype of the inputs.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F

DEFAULT_CHUNK = 64
_BACKENDS = ("torch", "fla")  # what each runs is its name: there is no backend that picks
_backend = os.environ.get("SOARPACK_GLA_BACKEND", "torch")


def set_backend(name: str) -> str:
    """Force the GLA implementation; returns the previous setting (for tests to restore)."""
    global _backend
    if name not in _BACKENDS:
        raise ValueError(f"GLA backend must be one of {_BACKENDS}, got {name!r}")
    previous, _backend = _backend, name
    return previous


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """`set_backend(name)` for the duration of a with-block."""
    previous = set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


# Sees the inputs and output of every torch-path call while set (soarpack.quant.glacheck compares fla against it).
_observer: Optional[Callable[..., None]] = None


@contextlib.contextmanager
def observe_torch_path(observer: Callable[..., None]) -> Iterator[None]:
    """Call `observer(q, k, v, g, scale, initial_state, output)` after every torch-path GLA call in the block."""
    global _observer
    previous, _observer = _observer, observer
    try:
        yield
    finally:
        _observer = previous


def current_backend() -> str:
    return _backend


def warm_up_fla(device: str, heads: int, head_dim: int, dtype: torch.dtype = torch.float32) -> None:
    """Compile and autotune fla's chunk kernels for the shapes and dtypes a model forward will use (Triton keys its
    autotune cache on them), so the first real forward finds them ready. Raises what fla raises."""
    q, k, v = (torch.randn(1, 2 * DEFAULT_CHUNK, heads, head_dim, device=device, dtype=dtype) for _ in range(3))
    g = -torch.linspace(0.01, 0.5, heads, device=device, dtype=torch.float64)
    fla_gla(q, k, v, g.to(dtype), head_dim**-0.5, None)
    torch.cuda.synchronize(device)


def fla_available() -> bool:
    try:
        import fla.ops.simple_gla  # noqa: F401
    except Exception:  # ImportError, or Triton failing to initialise without a GPU
        return False
    return True


def _use_fla(q: torch.Tensor) -> bool:
    if _backend == "torch":
        return False
    if _backend == "fla":
        if not fla_available():
            raise RuntimeError("SOARPACK_GLA_BACKEND=fla but fla.ops.simple_gla cannot be imported")
        return True
    raise RuntimeError(f"SOARPACK_GLA_BACKEND={_backend} is not one of {', '.join(_BACKENDS)}")


def _initial_state(state: Optional[torch.Tensor], shape: tuple, like: torch.Tensor) -> torch.Tensor:
    if state is not None:
        return state.to(like.dtype)
    return torch.zeros(shape, dtype=like.dtype, device=like.device)


CPU_TOKEN_HEADS = 2048  # a CPU segment's batch × heads × tokens: cache-sized tensors beat fewer, larger steps there


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: Optional[torch.Tensor] = None,
    chunk_size: int = DEFAULT_CHUNK,
    segment_len: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked simple GLA. q, k: [B,T,H,Dk]; v: [B,T,H,Dv]; g: [H] log-decay (≤ 0). Returns (o, final_state).

    All chunks of a segment at once, with no loop over them: a fixed dozen batched products, so a GPU is busy, not
    waiting on launches (the whole sequence is one segment there). On a CPU, segments of CPU_TOKEN_HEADS / (B·H)
    tokens (whole chunks, at least one) keep the tensors cache-sized: at a full layer's 32 heads one whole-sequence
    segment is 2× slower there. The state carries across segments exactly."""
    B, T, H, Dk = q.shape
    if T == 0:
        return v.new_zeros(B, 0, H, v.shape[-1]), _initial_state(initial_state, (B, H, Dk, v.shape[-1]), q)
    if segment_len is None:
        segment_len = T if q.is_cuda else max(1, CPU_TOKEN_HEADS // (B * H * chunk_size)) * chunk_size
    state, outs = initial_state, []
    for start in range(0, T, segment_len):
        end = start + segment_len
        out, state = _chunk_gla_segment(q[:, start:end], k[:, start:end], v[:, start:end], g, scale, state, chunk_size)
        outs.append(out)
    return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)), state


def _chunk_gla_segment(q, k, v, g, scale, initial_state, chunk_size):
    """`chunk_gla` on one segment. It is padded in front with zero tokens to whole chunks (a zero k and v add
    nothing to any state; their outputs are dropped). Every exponent is g times a distance ≥ 0, so nothing
    overflows; far-away terms underflow to 0, as they should."""
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    dtype, device = q.dtype, q.device
    C = chunk_size
    pad = (-T) % C
    N = (T + pad) // C
    # [B,H,N,C,D]: chunk n, row i within it
    q, k, v = (F.pad(x.transpose(1, 2), (0, 0, pad, 0)).reshape(B, H, N, C, -1) for x in (q, k, v))
    g = g.to(dtype).view(H, 1, 1)
    idx = torch.arange(C, device=device, dtype=dtype)
    rel = idx.view(-1, 1) - idx.view(1, -1)  # i - j
    decay = torch.where(rel >= 0, torch.exp(g * rel.clamp(min=0)), torch.zeros((), dtype=dtype, device=device))
    intra = (q @ k.transpose(-1, -2)) * decay.view(1, H, 1, C, C) @ v
    # Each chunk's own contribution to the state at its end, then the state entering chunk n:
    # S_n = sum_{m<n} exp(g·C·(n-1-m)) U_m, one [N, N] weight per head.
    k_age = torch.exp(g * (C - 1 - idx)).view(1, H, 1, C, 1)  # exp(g·(C-1-j)): age of k_j at chunk end
    local = (k * k_age).transpose(-1, -2) @ v  # [B,H,N,Dk,Dv]
    n = torch.arange(N, device=device, dtype=dtype)
    gap = n.view(-1, 1) - 1 - n.view(1, -1)  # n-1-m
    weight = torch.where(gap >= 0, torch.exp(g * C * gap.clamp(min=0)), torch.zeros((), dtype=dtype, device=device))
    entering = torch.einsum("hnm,bhmkv->bhnkv", weight, local)
    q_age = torch.exp(g * (idx + 1)).view(1, H, 1, C, 1)  # exp(g·(i+1)): state age at row i
    out = (intra + (q * q_age) @ entering).reshape(B, H, N * C, Dv)[:, :, pad:]
    final = torch.exp(g * C) * entering[:, :, -1] + local[:, :, -1]
    if initial_state is not None:  # decays into every output row and into the final state
        s0 = initial_state.to(dtype)
        age = torch.exp(g * torch.arange(1, T + 1, device=device, dtype=dtype)).view(1, H, T, 1)
        out = out + (q.reshape(B, H, N * C, Dk)[:, :, pad:] * age) @ s0
        final = final + torch.exp(g * T) * s0
    return (scale * out).transpose(1, 2), final


def recurrent_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token simple GLA (the decode form). Same arguments and results as `chunk_gla`."""
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    dtype = q.dtype
    state = _initial_state(initial_state, (B, H, Dk, Dv), q)
    decay = torch.exp(g.to(dtype)).view(1, H, 1, 1)
    outs = []
    for t in range(T):
        kt, vt = k[:, t], v[:, t]  # [B,H,D]
        state = decay * state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        outs.append(scale * (q[:, t].unsqueeze(-2) @ state).squeeze(-2))
    return torch.stack(outs, dim=1), state


def fla_gla(q, k, v, g, scale, initial_state):
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

    B, T, H, _ = q.shape
    gates = g.to(q.dtype).view(1, 1, H).expand(B, T, H).contiguous()
    fn = fused_recurrent_simple_gla if T == 1 else chunk_simple_gla
    o, state = fn(q, k, v, g=gates, scale=scale, initial_state=initial_state, output_final_state=True)
    return o, state


def gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Simple GLA through the chosen backend: the torch forms, or fla's kernels when asked for (module docstring)."""
    if _use_fla(q):
        return fla_gla(q, k, v, g, scale, initial_state)
    form = recurrent_gla if q.shape[1] == 1 else chunk_gla
    out = form(q, k, v, g, scale, initial_state)
    if _observer is not None:
        _observer(q, k, v, g, scale, initial_state, out[0])
    return out
