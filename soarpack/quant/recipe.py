"""Quantization recipes: named rule sets over the decoder linears, read from TOML.

A recipe file has a `[quant]` table (the base grid) and an ordered list of `[[quant.rules]]`:

    [quant]
    name = "w4-balanced"
    bits = 4            # 4 or 8 (what gptq_marlin serves)
    group_size = 128    # -1, 32, 64 or 128
    sym = true          # Marlin needs symmetric
    desc_act = false
    damp = 0.05

    [[quant.rules]]
    layers = "sparse"               # "all" | "sparse" | "lightning" | [0, 9, ...]
    last = 8                        # optional: keep only the last N (or `first = N`) of the selection
    modules = ["attn"]              # module names or the groups "attn", "mlp", "all"
    bits = 8                        # an override ... or `quantize = false` to keep the modules 16-bit

The first rule that matches a module wins; a module no rule matches gets the base grid. Rules are rendered once
(`render_dynamic`) into the `dynamic` dict that both GPTQModel (HF names, `q_proj`) and SGLang's `gptq_marlin`
(fused names, `qkv_proj`, `gate_up_proj`) read: first match wins, `re.match`, `-:` = not quantized,
`+:` = per-module overrides. Each regex lists both spellings, so one dict serves both readers.

Files in the recipes folder that have no `[quant]` table (serving profiles with a `[serve]` table) are not
recipes and are not listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from pydantic import Field

from soarpack import recipe_files
from soarpack.errors import ConfigError
from soarpack.evidence import Evidence, load_evidence
from soarpack.quant.options import CalibrationOverrides
from soarpack.quant.schema import StrictModel, validated
from soarpack.recipe_files import builtin_names, read_toml
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

_BASE_KEYS = {"name", "description", "bits", "group_size", "sym", "desc_act", "damp", "rules"}
_RULE_KEYS = {"layers", "first", "last", "modules", "quantize", "bits", "group_size", "note"}
_RECIPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*$")


class _RuleTypes(StrictModel):
    """The types of a `[[quant.rules]]` entry (keys are checked before, meaning after)."""

    layers: Union[str, List[int]] = "all"
    first: Optional[int] = None
    last: Optional[int] = None
    modules: Union[str, List[str], None] = None
    quantize: bool = True
    bits: Optional[int] = None
    group_size: Optional[int] = None
    note: Optional[str] = None


class _QuantTypes(StrictModel):
    """The types of the `[quant]` table."""

    name: Optional[str] = None
    description: str = ""
    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    damp: float = Field(0.05, allow_inf_nan=False)
    rules: List[Dict[str, Any]] = []


@dataclass(frozen=True)
class ModuleQuant:
    """The grid one module is quantized with."""

    bits: int
    group_size: int
    sym: bool = True
    desc_act: bool = False


@dataclass(frozen=True)
class Rule:
    layers: Union[str, Tuple[int, ...]]
    modules: Tuple[str, ...]  # HF names relative to the layer, expanded from groups
    quantize: bool = True
    bits: Optional[int] = None
    group_size: Optional[int] = None
    first: Optional[int] = None
    last: Optional[int] = None

    def layer_ids(self, config: SalaConfig) -> List[int]:
        if isinstance(self.layers, tuple):
            ids = [i for i in self.layers if i < config.num_hidden_layers]
        elif self.layers == "all":
            ids = list(range(config.num_hidden_layers))
        elif self.layers == "sparse":
            ids = list(config.sparse_layer_ids)
        else:
            ids = list(config.lightning_layer_ids)
        ids = sorted(ids)
        if self.first is not None:
            ids = ids[: self.first]
        if self.last is not None:
            ids = ids[-self.last:] if self.last > 0 else []
        return ids

    def overrides(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        if self.bits is not None:
            out["bits"] = self.bits
        if self.group_size is not None:
            out["group_size"] = self.group_size
        return out


@dataclass(frozen=True)
class Recipe:
    name: str
    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    damp: float = 0.05
    rules: Tuple[Rule, ...] = ()
    description: str = ""
    source: Optional[str] = field(default=None, compare=False)
    calibration: Optional[CalibrationOverrides] = None  # the `[calibration]` table: what the recipe sets
    evidence: Tuple[Evidence, ...] = field(default=(), compare=False)  # `[[evidence]]`: what is known about it

    @property
    def base(self) -> ModuleQuant:
        return ModuleQuant(self.bits, self.group_size, self.sym, self.desc_act)

    # -- rendering -----------------------------------------------------------------------------------------

    def render_dynamic(self, config: SalaConfig) -> Dict[str, Dict[str, Any]]:
        """The `dynamic` dict for GPTQModel and for the checkpoint's quantization_config (one renderer)."""
        dynamic: Dict[str, Dict[str, Any]] = {}
        for rule in self.rules:
            ids = rule.layer_ids(config)
            if not ids:
                continue
            body = rule_regex(ids, rule.modules)
            if not rule.quantize:
                dynamic[f"-:{body}"] = {}
            else:
                over = rule.overrides()
                if over:
                    dynamic[f"+:{body}"] = over
        return dynamic

    # -- planning ------------------------------------------------------------------------------------------

    def plan(self, config: SalaConfig) -> Dict[str, Optional[ModuleQuant]]:
        """Full HF name of every decoder linear -> its grid, or None when it stays 16-bit.

        Computed from the rendered `dynamic` (the same first-match regex walk GPTQModel and SGLang do), so the
        plan is what the readers of the checkpoint will see, not what we hoped the rules mean.
        """
        return resolve_plan(config, self.render_dynamic(config), self.base)

    def validate_for(self, config: SalaConfig) -> None:
        """Refuse, before any work, a recipe whose quantized modules Marlin cannot serve for this config."""
        for k, rule in enumerate(self.rules, 1):
            ids = rule.layer_ids(config)
            if not any(m in config.layer_linears(i) for i in ids for m in rule.modules):
                raise ConfigError(f"recipe {self.name!r} rule {k} matches no module of this model "
                                  f"(layers {list(ids) or _shown(rule.layers)}, modules {[m.split('.')[-1] for m in rule.modules]})",
                                  f"the model has {config.num_hidden_layers} layers; fix or remove the rule")
        plan = self.plan(config)
        shapes = config.decoder_linears()
        problems = []
        for name, mq in plan.items():
            if mq is None:
                continue
            out_f, in_f = shapes[name]
            if out_f % MARLIN_OUT_MULTIPLE or in_f % MARLIN_IN_MULTIPLE:
                problems.append(f"{name} [{out_f}, {in_f}] (Marlin needs out % 64 and in % 128)")
            elif mq.group_size > 0 and in_f % mq.group_size:
                problems.append(f"{name} in_features {in_f} is not a multiple of group_size {mq.group_size}")
        if problems:
            raise ConfigError(
                f"recipe {self.name!r} quantizes modules gptq_marlin cannot serve: {problems[0]}"
                + (f" and {len(problems) - 1} more" if len(problems) > 1 else ""),
                "keep those modules 16-bit with a `quantize = false` rule or pick another group_size",
            )


def _shown(layers: Union[str, Tuple[int, ...]]) -> Union[str, List[int]]:
    return list(layers) if isinstance(layers, tuple) else layers


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
    plan: Dict[str, Optional[ModuleQuant]] = {}
    for name in decoder_linear_names(config):
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


def decoder_linear_names(config: SalaConfig) -> List[str]:
    return list(config.decoder_linears())


# -- loading ------------------------------------------------------------------------------------------------


def _expand_modules(raw: Any, where: str) -> Tuple[str, ...]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: `modules` must be a non-empty list", 'e.g. modules = ["attn"] or ["qkv_proj", "o_proj"]')
    known = {m.split(".")[-1]: m for m in ALL_LINEARS}
    fused_short = {f.split(".")[-1]: members for f, members in FUSED_GROUPS.items()}
    out: List[str] = []
    for item in raw:
        item = str(item)
        short = item.split(".")[-1]
        if item in MODULE_GROUPS:
            out.extend(MODULE_GROUPS[item])
        elif short in fused_short:
            out.extend(fused_short[short])
        elif short in known:
            out.append(known[short])
        else:
            raise ConfigError(
                f"{where}: unknown module {item!r}",
                f"use one of {', '.join(sorted(set(known) | set(fused_short) | set(MODULE_GROUPS)))}",
            )
    mods = tuple(dict.fromkeys(out))
    for fused, members in FUSED_GROUPS.items():
        present = [m for m in members if m in mods]
        if present and len(present) != len(members):
            raise ConfigError(
                f"{where}: {', '.join(p.split('.')[-1] for p in present)} without the rest of SGLang's fused "
                f"{fused.split('.')[-1]} would split one fused module across two settings",
                f"name all of {', '.join(m.split('.')[-1] for m in members)} (or {fused.split('.')[-1]})",
            )
    return mods


def _check_grid(bits: Any, group_size: Any, where: str) -> None:
    if bits is not None and bits not in MARLIN_BITS:
        raise ConfigError(f"{where}: bits = {bits!r} is not served by gptq_marlin", "use 4 or 8")
    if group_size is not None and group_size not in MARLIN_GROUP_SIZES:
        raise ConfigError(f"{where}: group_size = {group_size!r} is not served by gptq_marlin", "use -1, 32, 64 or 128")


def _parse_rule(raw: Dict[str, Any], where: str) -> Rule:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a rule must be a table ([[quant.rules]])")
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}", f"allowed: {', '.join(sorted(_RULE_KEYS))}")
    if "sym" in raw or "desc_act" in raw:
        raise ConfigError(f"{where}: per-rule sym/desc_act are not supported", "set them once in [quant]")
    validated(_RuleTypes, raw, f"{where}: ")
    layers = raw.get("layers", "all")
    if isinstance(layers, list):
        if not all(isinstance(x, int) and x >= 0 for x in layers):
            raise ConfigError(f"{where}: `layers` list must hold layer indices", "e.g. layers = [0, 9, 16]")
        layers = tuple(layers)
    elif layers not in ("all", "sparse", "lightning"):
        raise ConfigError(f"{where}: layers = {layers!r} is not understood", 'use "all", "sparse", "lightning" or a list of indices')
    for key in ("first", "last"):
        if key in raw and (not isinstance(raw[key], int) or raw[key] < 0):
            raise ConfigError(f"{where}: `{key}` must be a non-negative integer")
    quantize = raw.get("quantize", True)
    if not isinstance(quantize, bool):
        raise ConfigError(f"{where}: `quantize` must be true or false")
    bits, group_size = raw.get("bits"), raw.get("group_size")
    if not quantize and (bits is not None or group_size is not None):
        raise ConfigError(f"{where}: a rule with quantize = false cannot also set bits/group_size")
    _check_grid(bits, group_size, where)
    if quantize and bits is None and group_size is None:
        raise ConfigError(f"{where}: the rule changes nothing", "set quantize = false, bits or group_size")
    return Rule(layers=layers, modules=_expand_modules(raw.get("modules"), where), quantize=quantize, bits=bits,
                group_size=group_size, first=raw.get("first"), last=raw.get("last"))


def recipe_from_dict(data: Dict[str, Any], *, default_name: str = "recipe", source: Optional[str] = None) -> Recipe:
    where = source or default_name
    q = data.get("quant")
    if not isinstance(q, dict):
        raise ConfigError(f"{where} has no [quant] table", "a recipe needs [quant] with bits, group_size, sym, desc_act")
    unknown = set(q) - _BASE_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) in [quant]: {', '.join(sorted(unknown))}", f"allowed: {', '.join(sorted(_BASE_KEYS))}")
    validated(_QuantTypes, q, f"{where} [quant]: ")
    calib = data.get("calibration")
    if calib is not None and not isinstance(calib, dict):
        raise ConfigError(f"{where}: calibration must be a table ([calibration])")
    calibration = validated(CalibrationOverrides, calib, f"{where} [calibration]: ") if calib else None
    bits, group_size = q.get("bits", 4), q.get("group_size", 128)
    _check_grid(bits, group_size, f"{where} [quant]")
    sym, desc_act, damp = q.get("sym", True), q.get("desc_act", False), q.get("damp", 0.05)
    if sym is not True:
        raise ConfigError(f"{where}: sym = {sym!r}: gptq_marlin serves symmetric quantization only", "set sym = true")
    if not isinstance(desc_act, bool):
        raise ConfigError(f"{where}: desc_act must be true or false")
    if not isinstance(damp, (int, float)) or not 0 < damp < 1:
        raise ConfigError(f"{where}: damp = {damp!r} must be in (0, 1)", "0.05 is a good default")
    rules_raw = q.get("rules", [])
    if not isinstance(rules_raw, list):
        raise ConfigError(f"{where}: rules must be an array of tables ([[quant.rules]])")
    rules = tuple(_parse_rule(r, f"{where} rule {k + 1}") for k, r in enumerate(rules_raw))
    return Recipe(name=str(q.get("name", default_name)), bits=bits, group_size=group_size, sym=True,
                  desc_act=desc_act, damp=float(damp), rules=rules, description=str(q.get("description", "")),
                  source=source, calibration=calibration, evidence=tuple(load_evidence(data, where)))


def list_recipes() -> List[str]:
    """Names of the built-in recipes (files in the recipes folder that have a [quant] table)."""
    return builtin_names("quant")


def load_recipe(name_or_path: Union[str, Path, Recipe]) -> Recipe:
    """A built-in recipe by name (`w4-mlp`) or a TOML file by path; validated, no config needed."""
    if isinstance(name_or_path, Recipe):
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if not (path.suffix == ".toml" or path.exists()):
        if not _RECIPE_NAME.match(text):  # a name never leaves the recipes folder
            raise ConfigError(f"recipe name {text!r} is not a built-in name",
                              f"built-in recipes: {', '.join(list_recipes())}; or pass a .toml file")
        path = recipe_files.RECIPES_DIR / f"{text}.toml"
        if not path.exists():
            raise ConfigError(f"no recipe named {text!r}", f"built-in recipes: {', '.join(list_recipes())}; or pass a .toml file")
    elif not path.exists():
        raise ConfigError(f"recipe file {text} does not exist", "check the path")
    data = read_toml(path)
    if "quant" not in data and "serve" in data:
        raise ConfigError(f"{path.name} is a serving profile, not a recipe", f"use its recipe {data.get('recipe', '?')!r}")
    return recipe_from_dict(data, default_name=path.stem, source=path.name)
