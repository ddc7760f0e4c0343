"""Simple gated linear attention (scalar decay per head), the recurrence of SALA's Lightning layers.

For every head h with log-decay g_h = -slope_h (a constant):

    S_t = exp(g_h) · S_{t-1} + k_tᵀ v_t          S: [d_k, d_v]
    o_t = scale · q_t S_t

Two exact forms of the same recurrence:
- `chunk_gla`: prefill. Within a chunk of C tokens the intra-chunk part is a masked, decayed q·kᵀ product; the
  state carries everything before the chunk. O(T·C·d + T·d²).
- `recurrent_gla`: decode, one token at a time, carrying the [heads, d_k, d_v] state.

`gla` picks `fla.ops.simple_gla` kernels (Triton) when they are importable and the tensors are on CUDA, else the
torch path. `set_backend("torch" | "fla" | "auto")` (or SOARPACK_GLA_BACKEND) forces one; tests use it to compare.
Shapes follow fla: q, k, v are [B, T, H, D]; states are [B, H, D_k, D_v]; all math here is in float32 or float64,
the dtype of the inputs.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator, Optional

import torch

DEFAULT_CHUNK = 64
_BACKENDS = ("auto", "torch", "fla")
_backend = os.environ.get("SOARPACK_GLA_BACKEND", "auto")


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
    return q.is_cuda and fla_available()


def _initial_state(state: Optional[torch.Tensor], shape: tuple, like: torch.Tensor) -> torch.Tensor:
    if state is not None:
        return state.to(like.dtype)
    return torch.zeros(shape, dtype=like.dtype, device=like.device)


def chunk_gla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    initial_state: Optional[torch.Tensor] = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked simple GLA. q, k: [B,T,H,Dk]; v: [B,T,H,Dv]; g: [H] log-decay (≤ 0). Returns (o, final_state)."""
    B, T, H, Dk = q.shape
    Dv = v.shape[-1]
    dtype = q.dtype
    state = _initial_state(initial_state, (B, H, Dk, Dv), q)
    # [B,H,T,D] so that the per-head matmuls batch over (B, H).
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g = g.to(dtype).view(1, H, 1, 1)
    out = torch.empty(B, H, T, Dv, dtype=dtype, device=q.device)
    idx = torch.arange(chunk_size, device=q.device, dtype=dtype)
    rel = idx.view(-1, 1) - idx.view(1, -1)  # i - j
    causal = rel >= 0
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        n = end - start
        qc, kc, vc = q[:, :, start:end], k[:, :, start:end], v[:, :, start:end]
        # decay[i, j] = exp(g·(i-j)) for j ≤ i, else 0
        decay = torch.where(causal[:n, :n], torch.exp(g * rel[:n, :n].clamp(min=0)), torch.zeros((), dtype=dtype, device=q.device))
        intra = (qc @ kc.transpose(-1, -2)) * decay @ vc
        q_decay = torch.exp(g * (idx[:n] + 1).view(1, 1, -1, 1))  # exp(g·(i+1)): state age at row i
        inter = (qc * q_decay) @ state
        out[:, :, start:end] = scale * (intra + inter)
        k_decay = torch.exp(g * (n - 1 - idx[:n]).view(1, 1, -1, 1))  # exp(g·(n-1-j)): age of k_j at chunk end
        state = torch.exp(g * n) * state + (kc * k_decay).transpose(-1, -2) @ vc
    return out.transpose(1, 2), state


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
    """Simple GLA through the chosen backend: fla kernels on CUDA when available, else the torch forms."""
    if _use_fla(q):
        return fla_gla(q, k, v, g, scale, initial_state)
    form = recurrent_gla if q.shape[1] == 1 else chunk_gla
    out = form(q, k, v, g, scale, initial_state)
    if _observer is not None:
        _observer(q, k, v, g, scale, initial_state, out[0])
    return out
