"""MiniCPM-SALA in plain PyTorch, readable top to bottom.

    h0     = embed_tokens(ids) · scale_emb
    h      = h + attn(norm(h)) · scale_depth/√L          attn: sparse (`minicpm4`) or Lightning, per mixer_types
    h      = h + mlp(norm(h))  · scale_depth/√L
    logits = lm_head(norm(h) / (hidden_size / dim_model_base))

Module and parameter names are the Hugging Face ones, so `state_dict()` keys are the checkpoint's tensor names.

The sparse layers here are dense causal attention at every length. The real model switches to InfLLM-v2
block-sparse attention above `sparse_config.dense_len` (8192 tokens); quantization calibrates below that length,
where the two are the same computation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from soarpack.sala.config import SalaConfig
from soarpack.sala.gla import gla


class RMSNorm(nn.Module):
    """RMSNorm with the variance in float32, cast back to the input dtype before the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE over the whole head dim, in float32. x: [B,T,H,D]; positions: [B,T].

    cos/sin are computed for the positions at hand, never as a 524288-row table.
    """
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    freqs = positions.float().unsqueeze(-1) * inv_freq  # [B,T,D/2]
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(2)  # [B,T,1,D]
    xf = x.float()
    x1, x2 = xf[..., : d // 2], xf[..., d // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    return xf * emb.cos() + rotated * emb.sin()


@dataclass
class LayerCache:
    """Decode state of one layer: keys/values for a sparse layer, the GLA state for a Lightning layer."""

    k: Optional[torch.Tensor] = None  # [B, T, H_kv, D]
    v: Optional[torch.Tensor] = None
    state: Optional[torch.Tensor] = None  # [B, H, D, D], float32
    seen: int = 0  # tokens consumed so far (the next token's position)


@dataclass
class SalaCache:
    layers: list[LayerCache] = field(default_factory=list)

    @classmethod
    def empty(cls, num_layers: int) -> "SalaCache":
        return cls([LayerCache() for _ in range(num_layers)])


class SparseAttention(nn.Module):
    """`minicpm4` layer: GQA causal attention (no RoPE in the release), output gate sigmoid(o_gate(x))."""

    def __init__(self, cfg: SalaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.use_rope, self.rope_theta = cfg.attn_use_rope, cfg.rope_theta
        h, q_dim, kv_dim = cfg.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.q_proj = nn.Linear(h, q_dim, bias=False)
        self.k_proj = nn.Linear(h, kv_dim, bias=False)
        self.v_proj = nn.Linear(h, kv_dim, bias=False)
        self.o_gate = nn.Linear(h, q_dim, bias=False) if cfg.attn_use_output_gate else None
        self.o_proj = nn.Linear(q_dim, h, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, key_mask: Optional[torch.Tensor] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim)
        if self.use_rope:
            q, k = rope(q, positions, self.rope_theta).to(x.dtype), rope(k, positions, self.rope_theta).to(x.dtype)
        past = 0
        if cache is not None:
            past = cache.k.shape[1] if cache.k is not None else 0
            if cache.k is not None:
                k, v = torch.cat([cache.k, k], dim=1), torch.cat([cache.v, v], dim=1)
            cache.k, cache.v = k, v
        S = k.shape[1]
        # causal over the full key range: query i (absolute past+i) sees keys 0..past+i
        allowed = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(diagonal=past)
        if key_mask is not None:  # padding: keys that are pad are hidden, except from themselves (no empty rows)
            allowed = allowed & (key_mask[:, None, None, :] | torch.eye(T, S, dtype=torch.bool, device=x.device))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=allowed,
            enable_gqa=self.heads != self.kv_heads,
        )  # [B,H,T,D]
        out = out.transpose(1, 2).reshape(B, T, self.heads * self.head_dim)
        if self.o_gate is not None:
            out = out * torch.sigmoid(self.o_gate(x))
        return self.o_proj(out)


class LightningAttention(nn.Module):
    """Lightning layer: per-head q/k RMSNorm, fp32 RoPE, fp32 simple GLA with ALiBi-slope decay, o_norm, z gate."""

    def __init__(self, cfg: SalaConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.lightning_nh, cfg.lightning_nkv, cfg.lightning_head_dim
        self.use_rope, self.rope_theta = cfg.lightning_use_rope, cfg.rope_theta
        self.scale = self.head_dim**-0.5
        h, q_dim, kv_dim = cfg.hidden_size, self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.q_proj = nn.Linear(h, q_dim, bias=False)
        self.k_proj = nn.Linear(h, kv_dim, bias=False)
        self.v_proj = nn.Linear(h, kv_dim, bias=False)
        self.z_proj = nn.Linear(h, q_dim, bias=False) if cfg.use_output_gate else None
        self.o_proj = nn.Linear(q_dim, h, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.o_norm = RMSNorm(q_dim, cfg.rms_norm_eps) if cfg.use_output_norm else None
        # log-decay per head; a buffer so it follows .to(device) but is not a checkpoint tensor
        self.register_buffer("g", -torch.tensor(cfg.lightning_slopes, dtype=torch.float64), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, key_mask: Optional[torch.Tensor] = None,
                cache: Optional[LayerCache] = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_rope:
            q, k = rope(q, positions, self.rope_theta), rope(k, positions, self.rope_theta)
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        q, k, v = q.to(compute), k.to(compute), v.to(compute)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        if key_mask is not None:  # a pad token adds nothing to the state
            m = key_mask[:, :, None, None].to(compute)
            k, v = k * m, v * m
        state = cache.state if cache is not None else None
        o, state = gla(q, k, v, self.g.to(compute), self.scale, state)
        if cache is not None:
            cache.state = state
        o = o.reshape(B, T, self.heads * self.head_dim).to(x.dtype)
        if self.o_norm is not None:
            o = self.o_norm(o)
        if self.z_proj is not None:
            o = o * torch.sigmoid(self.z_proj(x))
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg: SalaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SalaDecoderLayer(nn.Module):
    def __init__(self, cfg: SalaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.self_attn = SparseAttention(cfg) if cfg.is_sparse(layer_idx) else LightningAttention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.residual_scale = cfg.residual_scale

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        cache: Optional[LayerCache] = None,
        **ignored,
    ) -> torch.Tensor:
        """hidden_states [B,T,hidden]; position_ids [B,T] (default 0..T-1 after the cache);
        attention_mask [B,T] of 1 (token) / 0 (pad), optional, prefill only."""
        B, T, _ = hidden_states.shape
        if position_ids is None:
            start = cache.seen if cache is not None else 0
            position_ids = torch.arange(start, start + T, device=hidden_states.device).expand(B, T)
        key_mask = None
        if attention_mask is not None and attention_mask.dim() == 2:
            key_mask = attention_mask.to(torch.bool)
        h = self.self_attn(self.input_layernorm(hidden_states), position_ids, key_mask, cache)
        hidden_states = hidden_states + h * self.residual_scale
        h = self.mlp(self.post_attention_layernorm(hidden_states))
        if cache is not None:
            cache.seen += T
        return hidden_states + h * self.residual_scale


class SalaModel(nn.Module):
    def __init__(self, cfg: SalaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(SalaDecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class SalaForCausalLM(nn.Module):
    def __init__(self, cfg: SalaConfig):
        super().__init__()
        self.config = cfg
        self.model = SalaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def new_cache(self) -> SalaCache:
        return SalaCache.empty(self.config.num_hidden_layers)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The residual stream's start [B,T,hidden]: token embeddings times scale_emb."""
        return self.model.embed_tokens(input_ids) * self.config.scale_emb

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The last layer's residual stream [B,T,hidden] → logits [B,T,vocab]."""
        return self.lm_head(self.model.norm(h) / self.config.logits_divisor)

    def hidden_states(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, cache: Optional[SalaCache] = None) -> torch.Tensor:
        """The final normed hidden state [B,T,hidden], before the logits divisor."""
        return self.model.norm(self._residual(input_ids, attention_mask, cache))

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, cache: Optional[SalaCache] = None) -> torch.Tensor:
        """input_ids [B,T] → logits [B,T,vocab]. With `cache`, continues from (and updates) the cached state."""
        return self.logits(self._residual(input_ids, attention_mask, cache))

    def _residual(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor], cache: Optional[SalaCache]) -> torch.Tensor:
        position_ids = None
        if attention_mask is not None:
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        h = self.embed(input_ids)
        for i, layer in enumerate(self.model.layers):
            # keywords: GPTQModel captures layer 0's call and replays it to every layer
            layer_cache = cache.layers[i] if cache is not None else None
            h = layer(h, position_ids=position_ids, attention_mask=attention_mask, cache=layer_cache)
        return h

    @torch.no_grad()
    def greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding through the cache: prefill once, then one token a step. Returns the new tokens [B,N]."""
        cache = self.new_cache()
        logits = self(input_ids, cache=cache)
        out = []
        for _ in range(max_new_tokens):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
            logits = self(nxt, cache=cache)
        return torch.cat(out, dim=1)
