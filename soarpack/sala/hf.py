"""soarpack.sala as a transformers model, and its GPTQModel definition.

GPTQModel drives any `PreTrainedModel` whose decoder layers it can find through a declarative `module_tree`. The
release's remote code cannot run on CPU (SALA.md §3), so we hand GPTQModel our own plain-PyTorch SALA instead:
`SalaHFForCausalLM` wraps the very modules of a `SalaForCausalLM` (same objects, same HF names, nothing copied)
behind the small transformers surface GPTQModel touches (`config`, `forward(input_ids, attention_mask)`,
input/output embeddings).

`SalaGPTQ` is the definition: both layer kinds in one tree (`layer_modules_strict = False`: a sparse layer has
`o_gate`, a Lightning layer `z_proj` and its norms). Norms are forward-only (`:!`). Quantization order follows the
data flow inside a layer: q/k/v (+ o_gate or z_proj, which read the same normed input) → o_proj → gate/up → down.
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from soarpack.sala.config import MODEL_TYPE


class SalaHFConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, **kwargs):
        # Every key of the original config.json becomes an attribute; nothing derived is added.
        super().__init__(**kwargs)


class SalaHFForCausalLM(PreTrainedModel):
    config_class = SalaHFConfig
    base_model_prefix = "model"
    _no_split_modules = ["SalaDecoderLayer"]
    supports_gradient_checkpointing = False

    def __init__(self, config: SalaHFConfig, sala):
        super().__init__(config)
        self.model = sala.model
        self.lm_head = sala.lm_head
        # Kept outside the module tree so its parameters are not registered twice.
        object.__setattr__(self, "_sala", sala)

    @property
    def sala(self):
        return self._sala

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    def _init_weights(self, module):  # weights always come from a checkpoint
        pass

    def forward(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, **ignored) -> CausalLMOutput:
        return CausalLMOutput(logits=self._sala(input_ids, attention_mask=attention_mask))


def wrap_for_hf(sala) -> SalaHFForCausalLM:
    """A transformers view of a loaded SalaForCausalLM (shares its modules)."""
    raw = {k: v for k, v in sala.config.raw.items() if k not in ("auto_map", "architectures")}
    return SalaHFForCausalLM(SalaHFConfig(**raw), sala).eval()


def module_tree(shared_input: bool = True) -> list:
    """GPTQModel's module_tree for SALA. With `shared_input`, modules that read the same tensor are tagged
    (`:in=`) so GPTQModel accumulates one Hessian per input instead of one per module: q/k/v/o_gate/z_proj all read
    the input-normed hidden state, gate/up the post-attention-normed one (test_quant_e2e checks the result is
    identical to the untagged tree)."""
    a = ":in=attn_in" if shared_input else ""
    m = ":in=mlp_in" if shared_input else ""
    return [
        "model",
        "layers",
        "#",
        {
            "input_layernorm": ("input_layernorm:!",),
            "self_attn": (
                "q_norm:!", "k_norm:!", "o_norm:!",
                f"q_proj:0{a}", f"k_proj:0{a}", f"v_proj:0{a}", f"o_gate:0{a}", f"z_proj:0{a}",
                "o_proj:1",
            ),
            "post_attention_layernorm": ("post_attention_layernorm:!",),
            "mlp": (f"gate_proj:0{m}", f"up_proj:0{m}", "down_proj:1"),
        },
    ]


def _definition(shared_input: bool = True):
    from gptqmodel.models.base import BaseQModel

    class SalaGPTQ(BaseQModel):
        layer_modules_strict = False  # sparse layers have o_gate, Lightning layers z_proj and q/k/o norms
        pre_lm_head_norm_module = "model.norm"
        require_trust_remote_code = False
        shared_input_verified_model_types = frozenset({MODEL_TYPE}) if shared_input else frozenset()

    SalaGPTQ.module_tree = module_tree(shared_input)
    SalaGPTQ.__name__ = SalaGPTQ.__qualname__ = "SalaGPTQ" if shared_input else "SalaGPTQPlain"
    return SalaGPTQ


_REGISTERED = None


def gptq_definition(shared_input: bool = True):
    """The GPTQModel definition class, registered under `minicpm_sala` (idempotent).

    `shared_input=False` gives the plain definition peers used (one Hessian per module), for benchmarks."""
    global _REGISTERED
    if not shared_input:
        return _definition(shared_input=False)
    if _REGISTERED is None:
        from gptqmodel.models import auto

        cls = _definition()
        auto.MODEL_MAP[MODEL_TYPE] = cls
        if hasattr(auto, "SUPPORTED_MODELS") and MODEL_TYPE not in auto.SUPPORTED_MODELS:
            try:
                auto.SUPPORTED_MODELS.append(MODEL_TYPE)
            except AttributeError:
                pass
        _REGISTERED = cls
    return _REGISTERED
