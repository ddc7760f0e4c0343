"""A quantized checkpoint as a plain `SalaForCausalLM` with dequantized weights (for KL and logit checks)."""

from __future__ import annotations

from pathlib import Path

import torch

from soarpack.errors import CheckpointError
from soarpack.quant.gptq_format import dequantize
from soarpack.quant.recipe import ModuleQuant, resolve_plan


def load_dequantized(ckpt: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", *,
                     marlin: bool = False) -> torch.nn.Module:
    """Build the model from a GPTQ checkpoint, each quantized linear replaced by its dequantized weight.

    `marlin=True` reads the weights the way gptq_marlin does for sym (fixed zero 2^(b-1), qzeros ignored).
    """
    from soarpack.sala.checkpoint import assign_tensor, empty_model, finish_loading, iter_tensors
    from soarpack.sala.config import load_config

    ckpt = Path(ckpt)
    config = load_config(ckpt)
    qc = config.raw.get("quantization_config") or {}
    base = ModuleQuant(int(qc.get("bits", 4)), int(qc.get("group_size", 128)), bool(qc.get("sym", True)),
                       bool(qc.get("desc_act", False)))
    plan = resolve_plan(config, qc.get("dynamic") or {}, base)
    model = empty_model(config)
    params = dict(model.named_parameters())
    pending: dict[str, dict[str, torch.Tensor]] = {}
    loaded = set()
    for name, tensor in iter_tensors(ckpt):
        module, _, part = name.rpartition(".")
        if part in ("qweight", "qzeros", "scales", "g_idx"):
            pending.setdefault(module, {})[part] = tensor
            continue
        if name not in params:
            raise CheckpointError(f"unexpected tensor {name} in {ckpt}")
        assign_tensor(model, name, tensor.to(device=device, dtype=dtype))
        loaded.add(name)
    for module, parts in pending.items():
        mq = plan.get(module)
        if mq is None or len(parts) != 4:
            raise CheckpointError(f"{module} has GPTQ tensors the config does not expect")
        parts = {k: v.to(device) for k, v in parts.items()}  # unpack on the GPU when there is one
        w = dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], mq.bits, mq.group_size,
                       marlin=marlin, dtype=dtype)
        assign_tensor(model, f"{module}.weight", w)
        loaded.add(f"{module}.weight")
    missing = sorted(set(params) - loaded - ({"lm_head.weight"} if config.tie_word_embeddings else set()))
    if missing:
        raise CheckpointError(f"{ckpt} is missing {missing[:3]}")
    return finish_loading(model, ckpt, device)
