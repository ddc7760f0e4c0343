"""The packaged TOML files: quantization recipes (a `[quant]` table) in soarpack/recipes/ and serving profiles (a
`[serve]` table naming the recipe they serve) in soarpack/profiles/, read by one reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from soarpack import _toml
from soarpack.errors import ConfigError
from soarpack.inputs import MAX_TOML_BYTES, read_text_capped

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


def read_toml(path: Path) -> Dict[str, Any]:
    try:
        return _toml.loads(read_text_capped(path, "TOML file", MAX_TOML_BYTES))
    except _toml.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})", "fix the syntax at the line named") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})", "a recipe is a UTF-8 TOML file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def builtin_names(table: str) -> List[str]:
    """Names (file stems) of the packaged TOML files that hold `table` ("quant": recipes, "serve": profiles)."""
    names = []
    folder = RECIPES_DIR if table == "quant" else PROFILES_DIR
    for path in sorted(folder.glob("*.toml")):
        try:
            data = read_toml(path)
        except ConfigError:
            continue
        if isinstance(data.get(table), dict):
            names.append(path.stem)
    return names
