"""What a checkpoint or recipe asks of the GPU per step: its decoder linears as the fork fuses them (q+k+v, gate+up),
each with its shape, width and how many layers have it. Torch-free."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from soarpack.errors import ConfigError

# (size_n, size_k) -> class, as patch 04-w4-dispatch names them (SOARPACK_W4_SHAPE_CLASSES; a test keeps them equal)
SHAPE_CLASSES = {(4096, 4096): "attn", (4608, 4096): "sparse_qkv", (12288, 4096): "lightning_qkv",
                 (32768, 4096): "gate_up", (4096, 16384): "down"}
FUSED = {"self_attn.q_proj": "self_attn.qkv_proj", "self_attn.k_proj": "self_attn.qkv_proj",
         "self_attn.v_proj": "self_attn.qkv_proj", "mlp.gate_proj": "mlp.gate_up_proj", "mlp.up_proj": "mlp.gate_up_proj"}


def shape_class(size_n: int, size_k: int) -> str:
    return SHAPE_CLASSES.get((size_n, size_k), "other")


@dataclass(frozen=True)
class Linear:
    """One fused linear shape at one width; `count` modules of it in the decoder."""

    cls: str
    size_n: int
    size_k: int
    bits: int  # 16 = left unquantized
    count: int
    dispatchable: bool  # sym, group 128, no act order: the layers patch 04 routes

    @property
    def key(self) -> Tuple[int, int, int]:
        return (self.size_n, self.size_k, self.bits)


@dataclass(frozen=True)
class Workload:
    name: str  # recipe name or checkpoint path
    source: str  # "recipe" or "checkpoint"
    linears: Tuple[Linear, ...]

    def shapes(self) -> List[Tuple[int, int, int]]:
        """(size_n, size_k, bits) to measure, quantized ones only, in a stable order."""
        return sorted({ln.key for ln in self.linears if ln.bits != 16})


def workload_from_plan(name: str, source: str, config, plan: Dict[str, Optional[object]]) -> Workload:
    shapes = config.decoder_linears()
    fused: Dict[str, list] = {}
    for full, mq in plan.items():
        layer, _, rel = full.partition(".layers.")[2].partition(".")
        key = f"{layer}.{FUSED.get(rel, rel)}"
        fused.setdefault(key, []).append((shapes[full], mq))
    counts: Counter = Counter()
    for key, parts in fused.items():
        n = sum(s[0] for s, _ in parts)
        k = parts[0][0][1]
        grids = {None if mq is None else (mq.bits, mq.group_size, mq.sym, mq.desc_act) for _, mq in parts}
        if len(grids) != 1:
            raise ConfigError(f"layer {key}: the fused parts are quantized differently ({sorted(map(str, grids))})",
                              "SGLang fuses them into one module; give them one setting")
        grid = grids.pop()
        bits = 16 if grid is None else grid[0]
        ok = grid is not None and grid[1] == 128 and grid[2] and not grid[3]
        counts[(shape_class(n, k), n, k, bits, ok)] += 1
    linears = tuple(Linear(c, n, k, b, cnt, ok) for (c, n, k, b, ok), cnt in sorted(counts.items()))
    return Workload(name, source, linears)


def recipe_workload(name: str, config=None) -> Workload:
    """The workload of a built-in recipe (or recipe file) on the released MiniCPM-SALA shape (or `config`)."""
    from soarpack.recipe.model import load_recipe
    from soarpack.sala.config import SalaConfig
    from soarpack.sala.release import release_config_dict

    config = config or SalaConfig.from_dict(release_config_dict(), source="release")
    recipe = load_recipe(name)
    return workload_from_plan(recipe.name, "recipe", config, recipe.plan(config))


def bf16_workload(config=None) -> Workload:
    from soarpack.sala.config import SalaConfig
    from soarpack.sala.release import release_config_dict

    config = config or SalaConfig.from_dict(release_config_dict(), source="release")
    return workload_from_plan("bf16", "recipe", config, {n: None for n in config.decoder_linears()})


def checkpoint_workload(ckpt: Path) -> Workload:
    """The workload of a quantized checkpoint: its config.json and quantize_config.json (bits, group, dynamic)."""
    from soarpack.recipe.plan import ModuleQuant, resolve_plan
    from soarpack.sala.config import load_config

    ckpt = Path(ckpt)
    config = load_config(ckpt)
    qpath = ckpt / "quantize_config.json"
    if not qpath.is_file():
        raise ConfigError(f"{qpath} is missing", "pass a checkpoint written by `soarpack quantize`, or use --recipe NAME")
    try:
        q = json.loads(qpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{qpath} is not valid JSON: line {exc.lineno}: {exc.msg}") from exc
    if q.get("quant_method", "gptq") != "gptq":
        raise ConfigError(f"{qpath}: quant_method {q.get('quant_method')!r} is not gptq", "soarpack kernels measures GPTQ checkpoints")
    try:
        base = ModuleQuant(int(q["bits"]), int(q["group_size"]), bool(q.get("sym", True)), bool(q.get("desc_act", False)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{qpath}: no usable bits / group_size ({exc})", "the file soarpack quantize writes has both") from exc
    plan = resolve_plan(config, q.get("dynamic") or {}, base)
    return workload_from_plan(str(ckpt), "checkpoint", config, plan)
