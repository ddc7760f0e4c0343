"""Serving profiles: the server args, the SGLang patches they need and the quantization recipe they serve.

A profile is a TOML file in `soarpack/profiles/` (or any path) with a top-level `recipe`, a `[serve]` table and
optional `[[evidence]]` tables (what was measured about it):

    recipe = "w4-mlp"                 # the quantization recipe whose checkpoint this profile serves

    [serve]
    description = "..."
    args = ["--quantization", "gptq_marlin", "--dtype", "bfloat16", ...]
    patches = ["fp8-kv-query", ...]   # names from `soarpack sglang` (sglang/NN-name.patch)
    fallback = "safe"                 # the profile to use when the patches do not apply on the platform

`Profile.args_string()` is the value of SGLANG_SERVER_ARGS. Unknown keys and tables are refused, naming the
nearest known key (a `fallback` at the top level is told it belongs in [serve]).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from pydantic import field_validator

from soarpack.errors import ConfigError
from soarpack.evidence import Evidence
from soarpack.recipe.files import Located, builtin_names, locate, read_toml
from soarpack.recipe.keys import check_keys, read_evidence
from soarpack.schema import StrictModel, validated

# The default is "fast-gla" (issue 38): w4-mlp (what a peer passed the gate with, as "safe") with the w4-dispatch
# patch ("fast", issue 36: no slower than bf16 at any tier of either speed set on the fork's real server,
# benchmarks/RESULTS.md §11) and the gla-decode-in-place patch, which made that server 6.5-7.4 % faster at S1 and S8
# with "fast" run before and after it (§16). Unmeasured for it: sm_120, sgl-kernel 0.3.20, the sparse backend (its
# [[evidence]] says so, and check shows it as a risk); it falls back to "safe" where the patches do not apply, to
# Marlin where the dequantize route fails and to the fork's decode where the in-place kernel fails.
# "fp8-kv" is faster on paper, but every peer run of fp8 KV on the sparse path stayed below the gate with no S1 gain;
# it stays opt-in until measured, as do "fp8" and "fast-fp8" (FP8 GEMMs, unmeasured on SALA).
DEFAULT_PROFILE = "fast-gla"
# Renamed built-in profiles, old name -> new: what a MANIFEST written before the rename means by the old name.
# Issue 37: "fp8" (fp8_e5m2 KV on the sparse backend) became "fp8-kv", and "fp8" is now the W8A8 profile.
RENAMED = {"fp8": "fp8-kv"}


class Profile(StrictModel):
    name: str
    recipe: Optional[str] = None  # a recipe name (or a path) whose checkpoint this profile serves
    args: List[str]
    patches: List[str] = []
    fallback: Optional[str] = None
    description: str = ""
    evidence: List[Evidence] = []
    source: Optional[str] = None

    @field_validator("description")
    @classmethod
    def _one_line(cls, value: str) -> str:
        return " ".join(value.split())

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
            "evidence": [e.model_dump() for e in self.evidence],
        }


TOP_KEYS = ("recipe", "serve", "evidence")
SERVE_KEYS = tuple(k for k in Profile.model_fields if k not in ("name", "recipe", "evidence", "source"))
_ELSEWHERE = {**{k: f"[serve].{k}" for k in SERVE_KEYS}, "recipe": "the top level (recipe = ...)"}
_HINTS = {"args": 'write it as ["--flag", "value", ...]', "patches": 'write it as ["name", ...]',
          "fallback": 'write fallback = "safe"', "recipe": 'write recipe = "w4-mlp"', "description": "quote it"}


def profile_from_dict(data: Dict[str, Any], *, name: str, source: Optional[str] = None) -> Profile:
    where = source or name
    serve = data.get("serve")
    if "quant" not in data:
        check_keys(data, TOP_KEYS, where, elsewhere=_ELSEWHERE)
    if not isinstance(serve, dict):
        hint = "this file is a quantization recipe; pick a serving profile" if "quant" in data else "add a [serve] table with args"
        raise ConfigError(f"{where}: no [serve] table", hint)
    check_keys(serve, SERVE_KEYS, where, table_name="[serve]", elsewhere={"recipe": "the top level (recipe = ...)"})
    if "args" not in serve:
        raise ConfigError(f"{where}: [serve] has no args", "list the server flags in [serve].args")
    for key in ("args", "patches"):
        value = serve.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: [serve].{key} must be a list of strings", _HINTS[key])
    for key, value in (("recipe", data.get("recipe")), ("fallback", serve.get("fallback")),
                       ("description", serve.get("description"))):
        if value is not None and not isinstance(value, str):
            what = {"recipe": "recipe must be a recipe name", "fallback": "[serve].fallback must be a profile name",
                    "description": "[serve].description must be a string"}[key]
            raise ConfigError(f"{where}: {what}", _HINTS[key])
    evidence = read_evidence(data.get("evidence", []), where)
    fields = {k: v for k, v in serve.items() if v is not None}
    if not fields.get("fallback"):
        fields.pop("fallback", None)
    return validated(Profile, {**fields, "name": name, "recipe": data.get("recipe"), "source": source,
                               "evidence": evidence}, f"{where}: ")


def load_profile(name_or_path: Union[str, Path, Located, Profile]) -> Profile:
    """A profile by name (`fp8`, from soarpack/profiles/) or by path (it contains `/` or ends in `.toml`), or where
    one was located already."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    where = locate(name_or_path, "profile")
    return profile_from_dict(read_toml(where.path), name=where.name, source=str(where.path))


def list_profiles() -> List[str]:
    """Names of the packaged serving profiles (soarpack/profiles/*.toml with a [serve] table)."""
    return builtin_names("profile")


def recorded_profile(name: str, args: Optional[List[str]] = None) -> str:
    """The built-in profile a bundle's MANIFEST means by `name`: the renamed profile when `name` is its old name
    and the recorded args are the renamed profile's (a bundle built before the rename), else `name`."""
    new = RENAMED.get(name)
    if new and args is not None and new in list_profiles() and list(args) == load_profile(new).args:
        return new
    return name
