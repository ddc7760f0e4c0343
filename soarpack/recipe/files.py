"""The packaged TOML files: quantization recipes (a `[quant]` table) in soarpack/recipes/ and serving profiles (a
`[serve]` table naming the recipe they serve) in soarpack/profiles/, and the one rule that tells a name from a path.

Names resolve one way: an argument that contains `/` or ends in `.toml` is a file; anything else is a built-in
name, and only a built-in name. A file in the current folder named like a built-in (`w4-mlp`) never shadows it:
pass `./w4-mlp` to read that file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

from soarpack import _toml
from soarpack.errors import ConfigError
from soarpack.inputs import MAX_TOML_BYTES, read_text_capped

PACKAGE_DIR = Path(__file__).resolve().parent.parent
RECIPES_DIR = PACKAGE_DIR / "recipes"
PROFILES_DIR = PACKAGE_DIR / "profiles"
Kind = Literal["recipe", "profile"]
_TABLE = {"recipe": "quant", "profile": "serve"}
_PLURAL = {"recipe": "recipes", "profile": "serving profiles"}


def folder(kind: Kind) -> Path:
    # Read at each call, so a test can point a kind at another folder.
    return RECIPES_DIR if kind == "recipe" else PROFILES_DIR


def read_toml(path: Path) -> Dict[str, Any]:
    try:
        return _toml.loads(read_text(path))
    except _toml.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})", "fix the syntax at the line named") from None


def read_text(path: Path) -> str:
    try:
        return read_text_capped(path, "TOML file", MAX_TOML_BYTES)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})", "a recipe is a UTF-8 TOML file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a TOML file", "pass a .toml file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def builtin_names(kind: Kind) -> List[str]:
    """Names (file stems) of the packaged TOML files of this kind (recipes hold [quant], profiles [serve])."""
    names = []
    for path in sorted(folder(kind).glob("*.toml")):
        try:
            data = read_toml(path)
        except ConfigError:
            continue
        if isinstance(data.get(_TABLE[kind]), dict):
            names.append(path.stem)
    return names


def is_path(arg: Union[str, Path]) -> bool:
    """The rule: a path when it contains `/` (or the platform's separator) or ends in `.toml`; a name otherwise."""
    text = str(arg)
    return "/" in text or "\\" in text or text.endswith(".toml") or (isinstance(arg, Path) and len(arg.parts) > 1)


@dataclass(frozen=True)
class Located:
    """Where a recipe or profile comes from: a built-in name or a user's file (the one typed value of a reference)."""

    path: Path
    builtin: Optional[str]  # the built-in name, or None for a user's file

    @property
    def name(self) -> str:
        return self.builtin or self.path.stem

    @property
    def source(self) -> str:
        return f"built-in {self.builtin}" if self.builtin else str(self.path)

    @property
    def user_file(self) -> Optional[Path]:
        """The user's file, or None for a built-in."""
        return self.path if self.builtin is None else None


def locate(arg: Union[str, Path, Located], kind: Kind) -> Located:
    """The file a recipe or profile argument names, by the one rule (see the module docstring). A reference is
    located once, where a command receives it (build, quantize, check); what it located travels as the `Located`."""
    if isinstance(arg, Located):
        return arg
    text = str(arg)
    if is_path(arg):
        path = Path(text)
        if not path.exists() or path.is_dir():  # a device or a pipe is read_text's to refuse, for what it is
            what = "is a directory, not a TOML file" if path.is_dir() else "does not exist"
            raise ConfigError(f"{kind} file {text!r} {what}", "check the path")
        return Located(path, None)
    known = builtin_names(kind)
    if text in known:
        return Located(folder(kind) / f"{text}.toml", text)
    hint = f"built-in {_PLURAL[kind]}: {', '.join(known)}; or pass a .toml file"
    if Path(text).exists():
        hint += f" (to read {text!r} in this folder, pass ./{text})"
    if kind == "recipe" and text in builtin_names("profile"):
        raise ConfigError(f"{text!r} is a serving profile, not a recipe", hint)
    if kind == "profile" and text in builtin_names("recipe"):
        raise ConfigError(f"{text!r} has no [serve] table: it is a quantization recipe, not a serving profile", hint)
    raise ConfigError(f"no recipe named {text!r}" if kind == "recipe" else f"unknown serving profile {text!r}", hint)
