"""A quantized checkpoint read back as plain weights: the whole model (`load_dequantized`), or a part at a time for a
layer-streamed forward (`dequantized_source`). Either way the weights are what was written to disk."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import torch

from soarpack.errors import CheckpointError
from soarpack.quant.gptq_format import QUANT_PARTS, dequantize
from soarpack.recipe.checkpoint import base_grid
from soarpack.recipe.plan import resolve_plan

def load_dequantized(ckpt: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu", *,
                     marlin: bool = False) -> torch.nn.Module:
    """Build the model from a GPTQ checkpoint, each quantized linear replaced by its dequantized weight.

    `marlin=True` reads the weights the way gptq_marlin does for sym (fixed zero 2^(b-1), qzeros ignored).
    """
    from soarpack.sala.checkpoint import assign_tensor, empty_model, finish_loading
    from soarpack.sala.config import load_config

    ckpt = Path(ckpt)
    config = load_config(ckpt)
    model = empty_model(config)
    params = dict(model.named_parameters())
    loaded = set()
    for name, tensor in _dequantized_items(ckpt, config, None, dtype, device, marlin):
        if name not in params:
            raise CheckpointError(f"unexpected tensor {name} in {ckpt}")
        assign_tensor(model, name, tensor)
        loaded.add(name)
    missing = sorted(set(params) - loaded - ({"lm_head.weight"} if config.tie_word_embeddings else set()))
    if missing:
        raise CheckpointError(f"{ckpt} is missing {missing[:3]}")
    return finish_loading(model, ckpt, device)


def dequantized_source(ckpt: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """A `soarpack.sala.streaming.TensorSource` over a GPTQ checkpoint: the tensors under a prefix, quantized linears
    dequantized on `device`, read from disk on every call (nothing of the checkpoint is kept in memory)."""
    from soarpack.sala.config import load_config

    ckpt = Path(ckpt)
    config = load_config(ckpt)

    def tensors(prefix: str) -> Dict[str, torch.Tensor]:
        return dict(_dequantized_items(ckpt, config, prefix, dtype, device, marlin=False))

    return tensors


def _dequantized_items(ckpt: Path, config, prefix: Optional[str], dtype: torch.dtype, device: str,
                       marlin: bool) -> Iterator[Tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor (under `prefix`), a quantized module's four parts as one `.weight`."""
    from soarpack.sala.checkpoint import iter_tensors, weight_files

    qc = config.raw.get("quantization_config") or {}
    plan = resolve_plan(config, qc.get("dynamic") or {}, base_grid(qc))
    names = {n for n in weight_files(ckpt) if prefix is None or n.startswith(prefix)}
    pending: Dict[str, Dict[str, torch.Tensor]] = {}
    for name, tensor in iter_tensors(ckpt, names):
        module, _, part = name.rpartition(".")
        if part in QUANT_PARTS:
            pending.setdefault(module, {})[part] = tensor
            continue
        yield name, tensor.to(device=device, dtype=dtype)
    for module, parts in pending.items():
        mq = plan.get(module)
        if mq is None or len(parts) != len(QUANT_PARTS):
            raise CheckpointError(f"{module} has GPTQ tensors the config does not expect")
        parts = {k: v.to(device) for k, v in parts.items()}  # unpack on the GPU when there is one
        yield f"{module}.weight", dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"],
                                             mq.bits, mq.group_size, marlin=marlin, dtype=dtype)
