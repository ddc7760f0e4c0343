"""Serving profiles: the server args, the SGLang patches they need and the quantization recipe they serve.

A profile is a TOML file in `soarpack/profiles/` (or any path) with a top-level `recipe` and a `[serve]` table:

    recipe = "w4-mlp"                 # the quantization recipe whose checkpoint this profile serves

    [serve]
    description = "..."
    args = ["--quantization", "gptq_marlin", "--dtype", "bfloat16", ...]
    patches = ["fp8-kv-query", ...]   # names from `soarpack sglang` (sglang/NN-name.patch)
    fallback = "safe"                 # the profile to use when the patches do not apply on the platform

`Profile.args_string()` is the value of SGLANG_SERVER_ARGS.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from soarpack.errors import ConfigError
from soarpack import recipe_files
from soarpack.recipe_files import builtin_names, read_toml

# "safe" is what passed the accuracy gate on the platform (82.18). "fp8" is faster on paper, but every peer run of
# fp8 KV on the sparse path stayed below the gate (75-77.5) with no S1 gain; it stays opt-in until measured.
DEFAULT_PROFILE = "safe"
_SERVE_KEYS = {"description", "args", "patches", "fallback"}


@dataclass(frozen=True)
class Profile:
    name: str
    recipe: Optional[str]
    args: List[str]
    patches: List[str] = field(default_factory=list)
    fallback: Optional[str] = None
    description: str = ""
    source: Optional[str] = field(default=None, compare=False)

    def args_string(self) -> str:
        """SGLANG_SERVER_ARGS: the args joined with shell quoting (the platform splits on spaces)."""
        return shlex.join(self.args)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "recipe": self.recipe,
            "args": list(self.args),
            "args_string": self.args_string(),
            "patches": list(self.patches),
            "fallback": self.fallback,
            "description": self.description,
            "source": self.source,
        }


def _str_list(value: Any, where: str) -> List[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings", 'write it as ["--flag", "value", ...]')
    return list(value)


def profile_from_dict(data: Dict[str, Any], *, name: str, source: Optional[str] = None) -> Profile:
    where = source or name
    serve = data.get("serve")
    if not isinstance(serve, dict):
        hint = "this file is a quantization recipe; pick a serving profile" if "quant" in data else "add a [serve] table with args"
        raise ConfigError(f"{where}: no [serve] table", hint)
    unknown = sorted(set(serve) - _SERVE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key [serve].{unknown[0]}", "known keys: " + ", ".join(sorted(_SERVE_KEYS)))
    if "args" not in serve:
        raise ConfigError(f"{where}: [serve] has no args", "list the server flags in [serve].args")
    recipe = data.get("recipe")
    if recipe is not None and not isinstance(recipe, str):
        raise ConfigError(f"{where}: recipe must be a recipe name", 'write recipe = "w4-mlp"')
    fallback = serve.get("fallback")
    if fallback is not None and not isinstance(fallback, str):
        raise ConfigError(f"{where}: [serve].fallback must be a profile name", 'write fallback = "safe"')
    description = serve.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{where}: [serve].description must be a string", "quote it")
    return Profile(
        name=name,
        recipe=recipe,
        args=_str_list(serve["args"], f"{where}: [serve].args"),
        patches=_str_list(serve.get("patches", []), f"{where}: [serve].patches"),
        fallback=fallback or None,
        description=" ".join(description.split()),
        source=source,
    )


def load_profile(name_or_path: Union[str, Path, Profile]) -> Profile:
    """A profile by name (`fp8`, from soarpack/profiles/) or by path to a .toml file."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    raw = str(name_or_path)
    path = Path(raw)
    if raw.endswith(".toml") or path.is_file() or "/" in raw:
        if not path.exists():  # a folder or a device is read_toml's to refuse, for what it is
            raise ConfigError(f"profile file {path} does not exist", "check the path")
        return profile_from_dict(read_toml(path), name=path.stem, source=str(path))
    candidate = recipe_files.PROFILES_DIR / f"{raw}.toml"
    if not candidate.is_file():
        known = "known profiles: " + ", ".join(list_profiles())
        if (recipe_files.RECIPES_DIR / f"{raw}.toml").is_file():
            raise ConfigError(f"{raw!r} has no [serve] table: it is a quantization recipe, not a serving profile", known)
        raise ConfigError(f"unknown serving profile {raw!r}", known)
    return profile_from_dict(read_toml(candidate), name=raw, source=str(candidate))


def list_profiles() -> List[str]:
    """Names of the packaged serving profiles (soarpack/profiles/*.toml with a [serve] table)."""
    return builtin_names("serve")
