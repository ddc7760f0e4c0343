"""Quantization recipes: named rule sets over the decoder linears, a pydantic model read from TOML.

A recipe file has a `[quant]` table (the base grid), an ordered list of `[[quant.rules]]`, an optional
`[calibration]` table and `[[evidence]]` tables (what was measured about it). It states only what differs from the
defaults, which are the `Recipe` model's fields and stated nowhere else:

    [quant]
    name = "mine"         # default: the file's stem
    description = "..."
    method = "gptq"       # "gptq", or "none": no quantization at all (the checkpoint is the original, copied as is;
                          # for servers that quantize at load, like the fork's --quantization fp8)
    bits = 8              # 4 or 8 (what gptq_marlin serves)
    group_size = 64       # -1, 32, 64 or 128
    sym = true            # Marlin needs symmetric
    desc_act = true       # (slower under Marlin: the lint says so)
    damp = 0.01           # in (0, 1)

    [[quant.rules]]
    layers = "sparse"               # "all" | "sparse" | "lightning" | [0, 9, ...]
    last = 8                        # optional: keep only the last N (or `first = N`) of the selection
    modules = ["attn"]              # module names or the groups "attn", "mlp", "all"
    bits = 8                        # an override ... or `quantize = false` to keep the modules 16-bit

The first rule that matches a module wins; a module no rule matches gets the base grid (soarpack.recipe.plan).
Unknown keys and tables are refused, naming the nearest known key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

from pydantic import Field

from soarpack import _toml
from soarpack.errors import ConfigError
from soarpack.evidence import Evidence
from soarpack.recipe.calibration import CalibrationOverrides
from soarpack.recipe.files import Located, builtin_names, locate, read_text
from soarpack.recipe.keys import check_keys, read_evidence
from soarpack.recipe.plan import (FUSED_GROUPS, MARLIN_BITS, MARLIN_GROUP_SIZES, MARLIN_IN_MULTIPLE,
                                  MARLIN_OUT_MULTIPLE, MODULE_GROUPS, ModuleQuant, resolve_plan, rule_regex)
from soarpack.sala.config import ALL_LINEARS, SalaConfig
from soarpack.schema import StrictModel, validated

# What `soarpack quantize` runs without --recipe: the default serving profile's recipe (a test keeps them one).
DEFAULT_RECIPE = "w4-mlp"
LayerSelection = Union[Literal["all", "sparse", "lightning"], Tuple[int, ...]]


class Rule(StrictModel):
    """One `[[quant.rules]]` entry, its modules expanded to HF names relative to the layer."""

    layers: LayerSelection = "all"
    first: Optional[int] = Field(None, ge=0)
    last: Optional[int] = Field(None, ge=0)
    modules: Tuple[str, ...]
    quantize: bool = True
    bits: Optional[int] = None
    group_size: Optional[int] = None
    note: Optional[str] = None

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
        return {k: v for k, v in (("bits", self.bits), ("group_size", self.group_size)) if v is not None}


class Recipe(StrictModel):
    """The recipe: the base grid, the rules, the calibration it sets, what was measured about it."""

    name: str
    description: str = ""
    method: Literal["gptq", "none"] = "gptq"
    bits: int = 4
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    damp: float = Field(0.05, gt=0, lt=1, allow_inf_nan=False)
    rules: Tuple[Rule, ...] = ()
    calibration: Optional[CalibrationOverrides] = None  # the `[calibration]` table: what the recipe sets
    evidence: List[Evidence] = []  # the `[[evidence]]` tables
    source: Optional[str] = None  # where it was read: "built-in NAME", a file, "checkpoint"
    text: Optional[str] = Field(None, repr=False)  # the TOML it was read from, byte for byte

    @property
    def quantizes(self) -> bool:
        """False for method "none": the checkpoint is the original, byte for byte (nothing to calibrate)."""
        return self.method != "none"

    @property
    def base(self) -> ModuleQuant:
        return ModuleQuant(self.bits, self.group_size, self.sym, self.desc_act)

    # -- the TOML it is ------------------------------------------------------------------------------------

    def toml_text(self) -> str:
        """The TOML this recipe was read from, or (built in code) a rendering that reads back to the same recipe."""
        return self.text if self.text is not None else render_toml(self)

    def sha256(self) -> str:
        return hashlib.sha256(self.toml_text().encode("utf-8")).hexdigest()

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
        plan is what the readers of the checkpoint will see, not what we hoped the rules mean. Method "none":
        every linear stays 16-bit.
        """
        if not self.quantizes:
            return {name: None for name in config.decoder_linears()}
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


# The keys of each table, from the models (so a new field is a new key, and nothing else lists them).
TOP_TABLES = ("quant", "calibration", "evidence")
_NOT_IN_QUANT = ("calibration", "evidence", "source", "text")
QUANT_KEYS = tuple(k for k in Recipe.model_fields if k not in _NOT_IN_QUANT)
RULE_KEYS = tuple(Rule.model_fields)
_ELSEWHERE = {**{k: f"[quant].{k}" for k in QUANT_KEYS}, **{k: f"[calibration].{k}" for k in CalibrationOverrides.model_fields}}


def _shown(layers: LayerSelection) -> Union[str, List[int]]:
    return list(layers) if isinstance(layers, tuple) else layers


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


class _RuleTypes(StrictModel):
    """The TOML types of a rule's keys (no defaults here: the Rule model holds them)."""

    layers: Union[str, List[int], None] = None
    first: Optional[int] = None
    last: Optional[int] = None
    modules: Union[str, List[str], None] = None
    quantize: Optional[bool] = None
    bits: Optional[int] = None
    group_size: Optional[int] = None
    note: Optional[str] = None


def _parse_rule(raw: Any, where: str, servable: bool) -> Rule:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a rule must be a table ([[quant.rules]])")
    if "sym" in raw or "desc_act" in raw:
        raise ConfigError(f"{where}: per-rule sym/desc_act are not supported", "set them once in [quant]")
    check_keys(raw, RULE_KEYS, where, table_name="[[quant.rules]]")
    validated(_RuleTypes, raw, f"{where}: ")
    layers = raw.get("layers", Rule.model_fields["layers"].default)
    if isinstance(layers, list):
        if not all(x >= 0 for x in layers):
            raise ConfigError(f"{where}: `layers` list must hold layer indices", "e.g. layers = [0, 9, 16]")
        layers = tuple(layers)
    elif layers not in ("all", "sparse", "lightning"):
        raise ConfigError(f"{where}: layers = {layers!r} is not understood", 'use "all", "sparse", "lightning" or a list of indices')
    quantize = raw.get("quantize", Rule.model_fields["quantize"].default)
    bits, group_size = raw.get("bits"), raw.get("group_size")
    if not quantize and (bits is not None or group_size is not None):
        raise ConfigError(f"{where}: a rule with quantize = false cannot also set bits/group_size")
    if servable:
        _check_grid(bits, group_size, where)
    if quantize and bits is None and group_size is None:
        raise ConfigError(f"{where}: the rule changes nothing", "set quantize = false, bits or group_size")
    given = {k: v for k, v in raw.items() if k not in ("layers", "modules")}
    return validated(Rule, {**given, "layers": layers, "modules": _expand_modules(raw.get("modules"), where)}, f"{where}: ")


def recipe_from_dict(data: Dict[str, Any], *, default_name: str = "recipe", source: Optional[str] = None,
                     text: Optional[str] = None, servable: bool = True) -> Recipe:
    """The Recipe a TOML document describes; `servable` refuses what gptq_marlin cannot serve (the lint reads an
    unservable recipe's grid with servable=False, to say why)."""
    where = source or default_name
    if "quant" not in data and "serve" in data:
        raise ConfigError(f"{where} is a serving profile, not a recipe", f"use its recipe {data.get('recipe', '?')!r}")
    check_keys(data, TOP_TABLES, where, elsewhere=_ELSEWHERE)
    q = data.get("quant")
    if not isinstance(q, dict):
        raise ConfigError(f"{where} has no [quant] table", "a recipe needs [quant] (bits, group_size, ... or nothing)")
    check_keys(q, QUANT_KEYS, where, table_name="[quant]")
    calib = data.get("calibration")
    if calib is not None and not isinstance(calib, dict):
        raise ConfigError(f"{where}: calibration must be a table ([calibration])")
    if calib is not None:
        check_keys(calib, CalibrationOverrides.model_fields, where, table_name="[calibration]")
    calibration = validated(CalibrationOverrides, calib, f"{where} [calibration]: ") if calib else None
    evidence = read_evidence(data["evidence"], where) if "evidence" in data else []
    rules_raw = q.get("rules", [])
    if not isinstance(rules_raw, list):
        raise ConfigError(f"{where}: rules must be an array of tables ([[quant.rules]])")
    if servable:
        _check_grid(q.get("bits"), q.get("group_size"), f"{where} [quant]")
        if q.get("sym") is False:
            raise ConfigError(f"{where}: sym = false: gptq_marlin serves symmetric quantization only", "set sym = true")
    if q.get("method") == "none":
        given = sorted(k for k in q if k not in ("name", "description", "method"))
        if given or calib:
            raise ConfigError(f"{where}: method = \"none\" quantizes nothing, so {', '.join(given) or '[calibration]'} "
                              "has no meaning", "remove it, or use method = \"gptq\"")
    rules = tuple(_parse_rule(r, f"{where} rule {k + 1}", servable) for k, r in enumerate(rules_raw))
    fields = {k: v for k, v in q.items() if k != "rules"}
    fields.setdefault("name", default_name)
    return validated(Recipe, {**fields, "rules": rules, "calibration": calibration, "evidence": evidence,
                              "source": source, "text": text}, f"{where} [quant]: ")


def recipe_from_text(text: str, *, default_name: str, source: str, servable: bool = True) -> Recipe:
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML ({exc})", "fix the syntax at the line named") from None
    except TypeError:  # not text at all
        raise ConfigError(f"{source}: not TOML text") from None
    return recipe_from_dict(data, default_name=default_name, source=source, text=text, servable=servable)


def list_recipes() -> List[str]:
    """Names of the built-in recipes (files in the recipes folder that have a [quant] table)."""
    return builtin_names("recipe")


def locate_recipe(name_or_path: Union[str, Path, Located]) -> Located:
    """Where a recipe argument points: a built-in name, or a file (it contains `/` or ends in `.toml`)."""
    return locate(name_or_path, "recipe")


def load_recipe(name_or_path: Union[str, Path, Located, Recipe], *, servable: bool = True) -> Recipe:
    """A built-in recipe by name (`w4-mlp`) or a TOML file by path (see soarpack.recipe.files for the rule), or
    where one was located already."""
    if isinstance(name_or_path, Recipe):
        return name_or_path
    where = locate_recipe(name_or_path)
    return recipe_from_text(read_text(where.path), default_name=where.name, source=where.path.name, servable=servable)


# -- rendering back to TOML -------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


def _table(header: str, items: Sequence[Tuple[str, Any]]) -> List[str]:
    return [header, *(f"{k} = {_toml_value(v)}" for k, v in items if v is not None), ""]


def render_toml(recipe: Recipe) -> str:
    """A recipe as TOML, every setting stated (a checkpoint's copy must not depend on today's defaults)."""
    if not recipe.quantizes:  # the grid's keys mean nothing without quantization (and are refused)
        quant = [(k, getattr(recipe, k)) for k in ("name", "description", "method")]
    else:  # "gptq" is the default method and stays unwritten: the TOML of every GPTQ recipe is what it was
        quant = [(k, getattr(recipe, k)) for k in QUANT_KEYS if k not in ("rules", "method")]
    lines = _table("[quant]", quant)
    for rule in recipe.rules:
        lines += _table("[[quant.rules]]", [(k, list(v) if isinstance(v, tuple) else v)
                                            for k, v in rule.model_dump().items()])
    if recipe.calibration is not None:
        lines += _table("[calibration]", list(recipe.calibration.model_dump().items()))
    for entry in recipe.evidence:
        lines += _table("[[evidence]]", list(entry.model_dump().items()))
    return "\n".join(lines)
