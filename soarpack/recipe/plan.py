"""Which grid each decoder linear gets: the grids gptq_marlin serves, the `dynamic` regexes that carry a recipe's
rules to both readers, and the plan computed from them.

Rules are rendered once (`Recipe.render_dynamic`) into the `dynamic` dict that both GPTQModel (HF names, `q_proj`)
and SGLang's `gptq_marlin` (fused names, `qkv_proj`, `gate_up_proj`) read: first match wins, `re.match`, `-:` = not
quantized, `+:` = per-module overrides. Each regex lists both spellings, so one dict serves both readers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from soarpack.sala.config import ALL_LINEARS, ATTN_LINEARS, MLP_LINEARS, SalaConfig

MARLIN_BITS = (4, 8)
MARLIN_GROUP_SIZES = (-1, 32, 64, 128)
# gptq_marlin tiles: out_features % 64 and in_features % 128 (and in % group_size).
MARLIN_OUT_MULTIPLE = 64
MARLIN_IN_MULTIPLE = 128

# SGLang fuses these HF linears into one module each; they must share one setting.
FUSED_GROUPS: Dict[str, Tuple[str, ...]] = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}
MODULE_GROUPS = {"attn": ATTN_LINEARS, "mlp": MLP_LINEARS, "all": ALL_LINEARS}


@dataclass(frozen=True)
class ModuleQuant:
    """The grid one module is quantized with (the recipe's defaults are the Recipe model's, not repeated here)."""

    bits: int
    group_size: int
    sym: bool
    desc_act: bool


def _alt(names: Sequence[str]) -> str:
    return "(?:" + "|".join(re.escape(n) for n in names) + ")"


def _spellings(modules: Sequence[str]) -> List[str]:
    """HF names plus the SGLang fused name of each fused group they cover (complete groups only)."""
    names = list(modules)
    for fused, members in FUSED_GROUPS.items():
        if all(m in modules for m in members):
            names.append(fused)
    return names


def rule_regex(layer_ids: Sequence[int], modules: Sequence[str]) -> str:
    """One anchored regex matching these layers' modules under both HF and SGLang names."""
    layers = _alt([str(i) for i in sorted(set(layer_ids))])
    return rf"model\.layers\.{layers}\.{_alt(_spellings(modules))}$"


def match_dynamic(dynamic: Dict[str, Dict[str, Any]], module_name: str) -> Union[bool, Dict[str, Any], None]:
    """First-match semantics shared by GPTQModel and SGLang: False (skip), a dict (overrides) or None."""
    for key, over in dynamic.items():
        negative = key.startswith("-:")
        pattern = key[2:] if key[:2] in ("-:", "+:") else key
        if re.match(pattern, module_name):
            return False if negative else dict(over)
    return None


def resolve_plan(config: SalaConfig, dynamic: Dict[str, Dict[str, Any]], base: ModuleQuant) -> Dict[str, Optional[ModuleQuant]]:
    """Full HF name of every decoder linear -> its grid (`base` with the first matching rule's overrides), or None."""
    plan: Dict[str, Optional[ModuleQuant]] = {}
    for name in config.decoder_linears():
        hit = match_dynamic(dynamic, name)
        if hit is False:
            plan[name] = None
        else:
            hit = hit or {}
            plan[name] = ModuleQuant(
                bits=int(hit.get("bits", base.bits)),
                group_size=int(hit.get("group_size", base.group_size)),
                sym=bool(hit.get("sym", base.sym)),
                desc_act=bool(hit.get("desc_act", base.desc_act)),
            )
    return plan
