"""MiniCPM-SALA's `config.json`: parsed, validated, with the derived quantities the model needs.

Field names are the real ones (`mixer_types`, `lightning_nh`, `scale_depth`, ...). `SalaConfig.raw` keeps the
original dict untouched, so a writer can copy every field back without inventing any (the SGLang fork crashes on
derived keys written into `config.json`, see SALA.md §4).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soarpack.errors import ConfigError

SPARSE = "minicpm4"
LIGHTNING = "lightning-attn"
MIXER_TYPES = (SPARSE, LIGHTNING)
MODEL_TYPE = "minicpm_sala"

# The module catalogue: every decoder linear by its HF name relative to `model.layers.{i}.`, grouped by the tensor
# it reads, in the order they run. `SalaConfig.layer_linears` says which of them a given layer has; the model,
# tensor_shapes, the recipe planner, the GPTQ engine and verify all derive from these names.
ATTN_INPUT_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")  # read the input-normed state
SPARSE_GATE = "self_attn.o_gate"  # sparse layers, when attn_use_output_gate
LIGHTNING_GATE = "self_attn.z_proj"  # Lightning layers, when use_output_gate
ATTN_OUTPUT_LINEAR = "self_attn.o_proj"
MLP_INPUT_LINEARS = ("mlp.gate_proj", "mlp.up_proj")  # read the post-attention-normed state
MLP_OUTPUT_LINEAR = "mlp.down_proj"
ATTN_LINEARS = ATTN_INPUT_LINEARS + (SPARSE_GATE, LIGHTNING_GATE, ATTN_OUTPUT_LINEAR)
MLP_LINEARS = MLP_INPUT_LINEARS + (MLP_OUTPUT_LINEAR,)
ALL_LINEARS = ATTN_LINEARS + MLP_LINEARS

_REQUIRED_INT = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "lightning_nh",
    "lightning_nkv",
    "lightning_head_dim",
)


def alibi_slopes(n: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al.), including the interleaving rule when n is not a power of two."""

    def power_of_two(m: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(m) - 3)))
        return [start ** (i + 1) for i in range(m)]

    if n <= 0:
        raise ValueError("number of heads must be positive")
    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


@dataclass(frozen=True)
class SalaConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    lightning_nh: int
    lightning_nkv: int
    lightning_head_dim: int
    mixer_types: tuple[str, ...]
    sparse_config: dict = field(default_factory=dict)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    scale_emb: float = 1.0
    scale_depth: float = 1.0
    dim_model_base: float = 1.0
    attn_use_rope: bool = False
    lightning_use_rope: bool = True
    qk_norm: bool = True
    use_output_gate: bool = True
    attn_use_output_gate: bool = True
    use_output_norm: bool = True
    hidden_act: str = "silu"
    tie_word_embeddings: bool = False
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    # ---- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config.json") -> "SalaConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object at the top level")
        model_type = d.get("model_type")
        if model_type != MODEL_TYPE:
            raise ConfigError(
                f"{source}: model_type is {model_type!r}, not {MODEL_TYPE!r}",
                "point at a MiniCPM-SALA checkpoint (its config.json says model_type minicpm_sala)",
            )
        for key in _REQUIRED_INT:
            value = d.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{source}: field {key!r} must be a positive integer, got {value!r}")
        n_layers = d["num_hidden_layers"]
        mixers = d.get("mixer_types")
        if not isinstance(mixers, list):
            raise ConfigError(f"{source}: field 'mixer_types' must be a list of {list(MIXER_TYPES)}, got {mixers!r}")
        if len(mixers) != n_layers:
            raise ConfigError(
                f"{source}: field 'mixer_types' has {len(mixers)} entries but num_hidden_layers is {n_layers}"
            )
        for i, m in enumerate(mixers):
            if m not in MIXER_TYPES:
                raise ConfigError(f"{source}: field 'mixer_types'[{i}] is {m!r}; expected one of {list(MIXER_TYPES)}")
        if mixers[0] != SPARSE:
            raise ConfigError(f"{source}: field 'mixer_types'[0] must be {SPARSE!r} (layer 0 is a sparse layer)")
        hidden, heads, kv = d["hidden_size"], d["num_attention_heads"], d["num_key_value_heads"]
        head_dim = d.get("head_dim") or hidden // heads
        if heads % kv:
            raise ConfigError(f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
        if d["lightning_nh"] % d["lightning_nkv"]:
            raise ConfigError(f"{source}: field 'lightning_nh' is not a multiple of 'lightning_nkv'")
        sparse = d.get("sparse_config") or {}
        if not isinstance(sparse, dict):
            raise ConfigError(f"{source}: field 'sparse_config' must be an object")
        dense_len = sparse.get("dense_len", 8192)
        if not isinstance(dense_len, int) or isinstance(dense_len, bool) or dense_len <= 0:
            raise ConfigError(f"{source}: field 'sparse_config.dense_len' must be a positive integer, got {dense_len!r}")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{source}: field 'hidden_act' is {d.get('hidden_act')!r}; MiniCPM-SALA uses 'silu'")
        try:
            return cls(
                hidden_size=hidden,
                intermediate_size=d["intermediate_size"],
                num_hidden_layers=n_layers,
                num_attention_heads=heads,
                num_key_value_heads=kv,
                head_dim=int(head_dim),
                vocab_size=d["vocab_size"],
                lightning_nh=d["lightning_nh"],
                lightning_nkv=d["lightning_nkv"],
                lightning_head_dim=d["lightning_head_dim"],
                mixer_types=tuple(mixers),
                sparse_config=dict(sparse),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(d.get("rope_theta", 10000.0)),
                scale_emb=float(d.get("scale_emb", 1.0)),
                scale_depth=float(d.get("scale_depth", 1.0)),
                dim_model_base=float(d.get("dim_model_base", hidden)),
                attn_use_rope=bool(d.get("attn_use_rope", False)),
                lightning_use_rope=bool(d.get("lightning_use_rope", True)),
                qk_norm=bool(d.get("qk_norm", True)),
                use_output_gate=bool(d.get("use_output_gate", True)),
                attn_use_output_gate=bool(d.get("attn_use_output_gate", d.get("use_output_gate", True))),
                use_output_norm=bool(d.get("use_output_norm", True)),
                hidden_act="silu",
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                raw=dict(d),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: a numeric field has a value of the wrong type ({exc})") from exc

    # ---- derived quantities -------------------------------------------------------------------------------
    @property
    def sparse_layer_ids(self) -> list[int]:
        return [i for i, m in enumerate(self.mixer_types) if m == SPARSE]

    @property
    def lightning_layer_ids(self) -> list[int]:
        return [i for i, m in enumerate(self.mixer_types) if m == LIGHTNING]

    def is_sparse(self, layer: int) -> bool:
        return self.mixer_types[layer] == SPARSE

    @property
    def dense_len(self) -> int:
        """Prompt length at which the real model leaves dense attention for InfLLM-v2 (8192 in the release)."""
        return self.sparse_config.get("dense_len", 8192)

    @property
    def residual_scale(self) -> float:
        """μP: every residual branch is multiplied by scale_depth / sqrt(num_hidden_layers)."""
        return self.scale_depth / math.sqrt(self.num_hidden_layers)

    @property
    def logits_divisor(self) -> float:
        """μP: the final hidden state is divided by hidden_size / dim_model_base before lm_head."""
        return self.hidden_size / self.dim_model_base

    @property
    def lightning_slopes(self) -> list[float]:
        """Per-head decay rates of the Lightning layers; the log-decay per step is g = -slope."""
        return alibi_slopes(self.lightning_nh)

    def layer_linears(self, layer: int) -> tuple[str, ...]:
        """The catalogue names of the linears `layer` has, in the order they run."""
        gate = (SPARSE_GATE,) if self.is_sparse(layer) and self.attn_use_output_gate else ()
        if not self.is_sparse(layer) and self.use_output_gate:
            gate = (LIGHTNING_GATE,)
        return ATTN_INPUT_LINEARS + gate + (ATTN_OUTPUT_LINEAR,) + MLP_LINEARS

    def linear_shapes(self, layer: int) -> dict[str, tuple[int, int]]:
        """HF module name (relative to the layer) → (out_features, in_features) of every linear in `layer`."""
        h, inter = self.hidden_size, self.intermediate_size
        if self.is_sparse(layer):
            q, kv = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        else:
            q, kv = self.lightning_nh * self.lightning_head_dim, self.lightning_nkv * self.lightning_head_dim
        shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
                  SPARSE_GATE: (q, h), LIGHTNING_GATE: (q, h), ATTN_OUTPUT_LINEAR: (h, q),
                  "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), MLP_OUTPUT_LINEAR: (h, inter)}
        return {name: shapes[name] for name in self.layer_linears(layer)}

    def decoder_linears(self) -> dict[str, tuple[int, int]]:
        """Full HF name (`model.layers.{i}.mlp.down_proj`) → (out_features, in_features) of every decoder linear."""
        return {f"model.layers.{i}.{name}": shape
                for i in range(self.num_hidden_layers) for name, shape in self.linear_shapes(i).items()}

    def tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor a complete checkpoint holds, by HF name, with its shape."""
        h = self.hidden_size
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (self.vocab_size, h),
            "model.norm.weight": (h,),
        }
        if not self.tie_word_embeddings:
            shapes["lm_head.weight"] = (self.vocab_size, h)
        for i in range(self.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            for name, (out_f, in_f) in self.linear_shapes(i).items():
                shapes[p + name + ".weight"] = (out_f, in_f)
            if not self.is_sparse(i):
                if self.qk_norm:
                    shapes[p + "self_attn.q_norm.weight"] = (self.lightning_head_dim,)
                    shapes[p + "self_attn.k_norm.weight"] = (self.lightning_head_dim,)
                if self.use_output_norm:
                    shapes[p + "self_attn.o_norm.weight"] = (self.lightning_nh * self.lightning_head_dim,)
        return shapes


def read_config_json(path: str | Path) -> dict:
    """The raw `config.json` dict of a checkpoint directory (or the file itself), with clear errors."""
    path = Path(path)
    cfg_path = path / "config.json" if path.is_dir() else path
    if not path.exists():
        raise ConfigError(f"{path} does not exist", "pass the directory of a MiniCPM-SALA checkpoint")
    if not cfg_path.is_file():
        raise ConfigError(f"{cfg_path} is missing", "a Hugging Face checkpoint directory holds a config.json")
    try:
        return json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{cfg_path} is not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from exc


def load_config(path: str | Path) -> SalaConfig:
    """Load and validate the config of a checkpoint directory (or a config.json path)."""
    path = Path(path)
    raw = read_config_json(path)
    source = str(path / "config.json" if path.is_dir() else path)
    return SalaConfig.from_dict(raw, source=source)
