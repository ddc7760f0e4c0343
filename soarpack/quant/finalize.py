"""Write the quantized checkpoint the way SGLang's gptq_marlin reads it, and nothing else.

- Quantized linears: `.qweight/.qzeros/.scales/.g_idx` as GPTQModel packed them (GPTQ v1, see gptq_format).
- Every other tensor (embeddings, norms, lm_head, linears a `-:` rule keeps 16-bit) is copied from the original
  checkpoint unchanged: bf16 stays bf16 (fp16 only when asked).
- `config.json`: every original field, plus `quantization_config`; no derived key is ever written (the fork's
  config class has read-only properties and crashes on them).
- `config.json`'s `quantization_config` is soarpack.recipe.checkpoint's (it carries the recipe's TOML and sha256).
- `quantize_config.json`: the same quantization settings, for tools that read that file.
- Every other file (tokenizer, chat template, `generation_config.json`, remote-code `.py`) is copied byte for byte.

`auto_map`: kept as in the original by default. The platform's BF16 baseline serves the unmodified release
(auto_map included) with remote code trusted, so the fork demonstrably builds its model from that config.json;
SGLang rebuilds its own `MiniCPMHybridConfig` from the fields and the remote config class keeps unknown keys such
as `quantization_config` as attributes. Peers removed `auto_map.AutoConfig` (SALA.md §4); `auto_map="drop-config"`
does that for an A/B test on the platform, without touching the rest of auto_map.
"""

from __future__ import annotations

import json
import shutil
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Iterable, Optional

import torch

from soarpack.errors import ConfigError
from soarpack.placement.write import atomic_write_json, atomic_write_text
from soarpack.quant.gptq_format import QUANT_PARTS

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
AUTO_MAP_MODES = ("keep", "drop-config")


def write_config(src_dir: Path, out_dir: Path, qcfg: Dict[str, Any], *, auto_map: str = "keep",
                 torch_dtype: Optional[str] = None) -> None:
    if auto_map not in AUTO_MAP_MODES:
        raise ConfigError(f"auto_map mode {auto_map!r} is not one of {', '.join(AUTO_MAP_MODES)}")
    raw = json.loads((src_dir / "config.json").read_text(encoding="utf-8"), object_pairs_hook=OrderedDict)
    if auto_map == "drop-config" and isinstance(raw.get("auto_map"), dict):
        raw["auto_map"].pop("AutoConfig", None)
    if torch_dtype is not None:
        raw["torch_dtype"] = torch_dtype
    raw["quantization_config"] = qcfg
    atomic_write_text(out_dir / "config.json", json.dumps(raw, indent=2, ensure_ascii=False) + "\n")
    atomic_write_json(out_dir / "quantize_config.json", qcfg)


def copy_side_files(src_dir: Path, out_dir: Path) -> list[str]:
    """Copy every non-weight file (tokenizer, templates, generation config, remote code) byte for byte."""
    copied = []
    for path in sorted(src_dir.iterdir()):
        name = path.name
        if not path.is_file() or name.startswith("."):
            continue
        if name.endswith(WEIGHT_SUFFIXES) or name in WEIGHT_INDEXES or name in ("config.json", "quantize_config.json"):
            continue
        shutil.copyfile(path, out_dir / name)
        copied.append(name)
    return copied


def collect_tensors(quantized: Dict[str, Dict[str, torch.Tensor]], original_tensors: Iterable, *,
                    float_dtype: torch.dtype = torch.bfloat16) -> Dict[str, torch.Tensor]:
    """Quantized modules' packed tensors + every original tensor not replaced by them."""
    out: Dict[str, torch.Tensor] = {}
    for module, parts in quantized.items():
        for key in QUANT_PARTS:
            t = parts[key].detach().to("cpu")
            out[f"{module}.{key}"] = t.to(torch.float16) if key == "scales" else t.to(torch.int32)
    for name, tensor in original_tensors:
        module = name.rsplit(".", 1)[0]
        if module in quantized and name.endswith(".weight"):
            continue
        if tensor.is_floating_point() and tensor.dtype != float_dtype:
            tensor = tensor.to(float_dtype)
        out[name] = tensor
    return out

