"""Forward passes that hold one decoder layer's weights on the device at a time.

A 9B model's few evaluation rows need a few hundred MiB of activations, but the whole bf16 model is 17.65 GiB: so
the rows go through the model layer by layer. Each layer's tensors are fetched from a `TensorSource` (an
in-memory model, or a checkpoint on disk, dequantized), placed on the device, applied to every row, and dropped
before the next layer comes. Every row runs alone (batch 1) through the same modules and operations as
`SalaForCausalLM.forward`, so the logits are those of the whole-model forward.
The GLA backend is the one in force (`soarpack.sala.gla.use_backend`).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import torch

from soarpack.sala.config import SalaConfig

# The tensors whose names start with a prefix ("model.layers.3."), by full name; a layer's worth at a time.
TensorSource = Callable[[str], Dict[str, torch.Tensor]]


def model_source(model: torch.nn.Module) -> TensorSource:
    """The parameters of an in-memory model (left where they are: the streamed copy is a separate module)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    return lambda prefix: {n: p.detach() for n, p in params.items() if n.startswith(prefix)}


def streamed_logits(
    config: SalaConfig,
    source: TensorSource,
    rows: Sequence[Sequence[int]],
    device: str,
    dtype: torch.dtype = torch.bfloat16,
    postprocess: Callable[[torch.Tensor], torch.Tensor] = lambda logits: logits,
) -> List[torch.Tensor]:
    """Logits [T, vocab] of each row, passed through `postprocess` on the device, then moved to the CPU; at most one
    decoder layer's weights (plus the embedding or the head) are on `device` at a time."""
    from soarpack.sala.checkpoint import empty_model

    model = empty_model(config)
    with torch.no_grad():
        _place(model, source, "model.embed_tokens.", device, dtype)
        hidden = [model.embed(torch.tensor([list(ids)], device=device)) for ids in rows]
        _drop(model.model.embed_tokens)
        for i, layer in enumerate(model.model.layers):
            _place(model, source, f"model.layers.{i}.", device, dtype, layer)
            hidden = [layer(h) for h in hidden]
            _drop(layer)
        _place(model, source, "model.norm.", device, dtype)
        if config.tie_word_embeddings:
            model.lm_head.weight = torch.nn.Parameter(_fetch(source, "model.embed_tokens.", device, dtype)[
                "model.embed_tokens.weight"], requires_grad=False)
        else:
            _place(model, source, "lm_head.", device, dtype)
        outputs = [postprocess(model.logits(h)[0]).cpu() for h in hidden]
        _drop(model)
    return outputs


def _fetch(source: TensorSource, prefix: str, device: str, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    return {n: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype) for n, t in source(prefix).items()}


def _place(model: torch.nn.Module, source: TensorSource, prefix: str, device: str, dtype: torch.dtype,
           layer: Optional[torch.nn.Module] = None) -> int:
    """Put the tensors under `prefix` into the (meta) model on `device`; returns how many."""
    from soarpack.sala.checkpoint import assign_tensor, rebuild_buffers

    tensors = _fetch(source, prefix, device, dtype)
    if not tensors:
        raise KeyError(f"no tensors under {prefix!r}")
    for name, tensor in tensors.items():
        assign_tensor(model, name, tensor)
    if layer is not None:
        rebuild_buffers(layer, model.config, device)
    return len(tensors)


def _drop(module: torch.nn.Module) -> None:
    """Back to meta: the device memory is freed (the source's own tensors are untouched)."""
    module.to("meta")
