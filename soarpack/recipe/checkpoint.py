"""The quantization_config pair: a Recipe into a checkpoint's config.json, and the recipe back out of it.

The checkpoint carries its recipe itself: `meta.recipe_toml` is the recipe's TOML text and `meta.recipe_sha256` its
sha256, so a checkpoint quantized from a user's recipe file is judged against that recipe with no file at hand.
Checkpoints written before soarpack carried the text name a built-in recipe in `meta.recipe`; those still read.
The other keys are what SGLang's gptq_marlin (and GPTQModel) read; a key the checkpoint leaves out is read with the
Recipe model's default.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, Optional, Sequence

from soarpack.errors import ConfigError
from soarpack.recipe.model import Recipe, list_recipes, load_recipe, recipe_from_text
from soarpack.recipe.plan import ModuleQuant
from soarpack.sala.config import SalaConfig

CHECKPOINT_SOURCE = "the checkpoint's quantization_config"


def quantization_config(recipe: Recipe, config: SalaConfig, quantizer: Sequence[str]) -> Dict[str, Any]:
    """The `quantization_config` of config.json (and quantize_config.json's content). `quantizer`: who wrote it,
    e.g. ["soarpack:VERSION", "gptqmodel:VERSION"] (soarpack.quant.engine.quantizer)."""
    return {
        "quant_method": "gptq",
        "checkpoint_format": "gptq",
        "bits": recipe.bits,
        "group_size": recipe.group_size,
        "sym": recipe.sym,
        "desc_act": recipe.desc_act,
        "lm_head": False,
        "damp_percent": recipe.damp,
        "true_sequential": True,
        "pack_dtype": "int32",
        "dynamic": recipe.render_dynamic(config),
        "meta": {"quantizer": list(quantizer), "recipe": recipe.name, "recipe_toml": recipe.toml_text(),
                 "recipe_sha256": recipe.sha256()},
    }


def base_grid(qc: Dict[str, Any]) -> ModuleQuant:
    """The base grid a quantization_config states; a key it leaves out has the Recipe model's default."""
    def get(key: str) -> Any:
        return qc.get(key, Recipe.model_fields[key].default)

    return ModuleQuant(int(get("bits")), int(get("group_size")), bool(get("sym")), bool(get("desc_act")))


def recipe_of_checkpoint(qc: Dict[str, Any]) -> Recipe:
    """The recipe a checkpoint was quantized with, from its quantization_config (see the module docstring)."""
    meta = qc.get("meta") if isinstance(qc.get("meta"), dict) else {}
    text, digest, name = meta.get("recipe_toml"), meta.get("recipe_sha256"), meta.get("recipe")
    if isinstance(text, str):
        actual = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if digest != actual:
            raise ConfigError(f"{CHECKPOINT_SOURCE}: meta.recipe_toml does not match its meta.recipe_sha256 "
                              f"({str(digest)[:12]}... recorded, {actual[:12]}... read)",
                              "the config was edited by hand: quantize again, or pass --recipe FILE")
        return recipe_from_text(text, default_name=str(name or "recipe"), source=CHECKPOINT_SOURCE)
    if isinstance(name, str) and name in list_recipes():
        return load_recipe(name)  # a built-in name only: a checkpoint never makes us read a file of this machine
    named = f"names recipe {name!r}, which is not a built-in, and" if name else "names no recipe and"
    raise ConfigError(f"{CHECKPOINT_SOURCE} {named} carries no recipe text (meta.recipe_toml)",
                      "pass --recipe FILE (the recipe it was quantized with)")


def recipe_for(qc: Dict[str, Any], given: Optional[Any] = None) -> Recipe:
    """The recipe to judge a checkpoint against: the one given (a name, path or Recipe), else its own."""
    return load_recipe(given) if given is not None else recipe_of_checkpoint(qc)
