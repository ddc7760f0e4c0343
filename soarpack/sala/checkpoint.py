"""Checkpoint I/O in the Hugging Face layout: `model.safetensors`, or shards + `model.safetensors.index.json`.

Loading goes tensor by tensor into a model built on the meta device, so peak memory is one copy of the weights
in the target dtype (no fp32 copy of a bf16 checkpoint, no RoPE tables).
"""

from __future__ import annotations

import errno
import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from soarpack.errors import CheckpointError
from soarpack.placement.checks import is_disk_full
from soarpack.placement.write import atomic_write_json
from soarpack.sala.config import SalaConfig, load_config

if TYPE_CHECKING:
    from soarpack.sala.model import SalaForCausalLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(ckpt: str | Path) -> dict[str, Path]:
    """Tensor name → the safetensors file that holds it; checks that every file the index names exists."""
    ckpt = Path(ckpt)
    index = ckpt / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index ({exc})") from exc
        files = {name: ckpt / fname for name, fname in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise CheckpointError(f"shard {path.name} named in {INDEX_FILE} is missing from {ckpt}")
        return files
    single = ckpt / SINGLE_FILE
    if single.is_file():
        try:
            with safe_open(single, framework="pt") as fh:
                return {name: single for name in fh.keys()}
        except Exception as exc:  # safetensors raises its own error types for truncated or corrupt files
            raise CheckpointError(f"cannot read {single}: {exc}", "the file is truncated or corrupt") from None
    raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} in {ckpt}", "is this a Hugging Face checkpoint directory?")


def iter_tensors(ckpt: str | Path, names: Optional[set[str]] = None, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) one at a time, file by file, optionally only `names`."""
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name, path in weight_files(ckpt).items():
        if names is None or name in names:
            by_file[path].append(name)
    for path in sorted(by_file):
        try:
            with safe_open(path, framework="pt", device=device) as fh:
                present = set(fh.keys())
                for name in sorted(by_file[path]):
                    if name not in present:
                        raise CheckpointError(f"{path.name} does not hold tensor {name} that the index maps to it")
                    yield name, fh.get_tensor(name)
        except CheckpointError:
            raise
        except Exception as exc:  # safetensors raises its own error types for truncated or corrupt files
            raise CheckpointError(f"cannot read {path}: {exc}") from exc


def read_state_dict(ckpt: str | Path) -> dict[str, torch.Tensor]:
    return dict(iter_tensors(ckpt))


def load_model(
    ckpt: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    config: Optional[SalaConfig] = None,
):
    """Build `SalaForCausalLM` from a checkpoint directory, with every tensor checked against the config."""
    cfg = config or load_config(ckpt)
    expected = cfg.tensor_shapes()
    model = empty_model(cfg)
    seen = set()
    for name, tensor in iter_tensors(ckpt, device=str(device) if str(device) != "meta" else "cpu"):
        if name not in expected:
            if name.endswith((".qweight", ".qzeros", ".scales", ".g_idx")):
                raise CheckpointError(
                    f"{ckpt} holds GPTQ tensors ({name})",
                    "load a quantized checkpoint with soarpack.quant.dequantize, or point at the original model",
                )
            raise CheckpointError(f"unexpected tensor {name} in {ckpt} for this config")
        if tuple(tensor.shape) != expected[name]:
            raise CheckpointError(
                f"tensor {name} has shape {tuple(tensor.shape)} but config.json implies {expected[name]}"
            )
        assign_tensor(model, name, tensor.to(device=device, dtype=dtype))
        seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{ckpt} is missing tensors: {', '.join(missing[:3])}{more}")
    return finish_loading(model, ckpt, device)


def empty_model(cfg: SalaConfig) -> SalaForCausalLM:
    """`SalaForCausalLM` on the meta device: no memory and no random init until tensors are assigned."""
    from soarpack.sala.model import SalaForCausalLM

    with torch.device("meta"):
        return SalaForCausalLM(cfg)


def assign_tensor(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    setattr(model.get_submodule(module_name), attr, torch.nn.Parameter(tensor, requires_grad=False))


def finish_loading(model: SalaForCausalLM, ckpt: str | Path, device: str | torch.device) -> SalaForCausalLM:
    """After every tensor is assigned: tie embeddings, rebuild the decay buffers, refuse any parameter left on meta."""
    cfg = model.config
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for layer in model.model.layers:
        rebuild_buffers(layer, cfg, device)
    leftover = [n for n, p in model.named_parameters() if p.is_meta]
    if leftover:
        raise CheckpointError(f"parameters not loaded from {ckpt}: {leftover[:3]}")
    return model.eval()


def rebuild_buffers(layer: torch.nn.Module, cfg: SalaConfig, device: str | torch.device) -> None:
    """A layer's non-persistent decay buffer, built on meta with the model: make it on `device`."""
    if hasattr(layer.self_attn, "g"):
        layer.self_attn.g = -torch.tensor(cfg.lightning_slopes, dtype=torch.float64, device=device)


def save_state_dict(
    tensors: dict[str, torch.Tensor],
    out_dir: str | Path,
    max_shard_bytes: int = 5 * 1024**3,
) -> list[str]:
    """Write tensors in the HF layout; several shards plus an index when they exceed `max_shard_bytes`.

    Returns the file names written. Shards are filled in name order, so output is deterministic.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors, key=_natural_key):
        t = tensors[name].contiguous()
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    metadata = {"format": "pt"}
    if len(shards) == 1:
        _save_file(shards[0], out_dir / SINGLE_FILE, metadata)
        return [SINGLE_FILE]
    names = []
    weight_map = {}
    total = 0
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        _save_file(shard, out_dir / fname, metadata)
        names.append(fname)
        for k, t in shard.items():
            weight_map[k] = fname
            total += t.numel() * t.element_size()
    atomic_write_json(out_dir / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return names + [INDEX_FILE]


def _save_file(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    try:
        save_file(tensors, str(path), metadata=metadata)
    except Exception as exc:
        if is_disk_full(exc):  # safetensors wraps ENOSPC in its own error: make it an OSError callers recognise
            raise OSError(errno.ENOSPC, f"no space left on the device while writing {path.name}") from exc
        raise


def _natural_key(name: str):
    return [int(part) if part.isdigit() else part for part in name.split(".")]
