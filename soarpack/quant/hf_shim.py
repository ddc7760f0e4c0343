"""soarpack.sala as a transformers model, for GPTQModel (used only by soarpack.quant.engine).

GPTQModel drives any `PreTrainedModel` whose decoder layers it can find through a declarative `module_tree`. The
release's remote code cannot run on CPU (SALA.md §3), so we hand GPTQModel our own plain-PyTorch SALA instead:
`SalaHFForCausalLM` wraps the very modules of a `SalaForCausalLM` (same objects, same HF names, nothing copied)
behind the small transformers surface GPTQModel touches (`config`, `forward(input_ids, attention_mask)`,
input/output embeddings).
"""

from __future__ import annotations

from typing import Optional

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from soarpack.sala.config import MODEL_TYPE


class SalaHFConfig(PretrainedConfig):
    model_type = MODEL_TYPE

    def __init__(self, **kwargs: object):
        # Every key of the original config.json becomes an attribute; nothing derived is added.
        super().__init__(**kwargs)


class SalaHFForCausalLM(PreTrainedModel):
    config_class = SalaHFConfig
    base_model_prefix = "model"
    _no_split_modules = ["SalaDecoderLayer"]
    supports_gradient_checkpointing = False

    def __init__(self, config: SalaHFConfig, sala: torch.nn.Module):
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


def wrap_for_hf(sala: torch.nn.Module) -> SalaHFForCausalLM:
    """A transformers view of a loaded SalaForCausalLM (shares its modules)."""
    raw = {k: v for k, v in sala.config.raw.items() if k not in ("auto_map", "architectures")}
    return SalaHFForCausalLM(SalaHFConfig(**raw), sala).eval()
