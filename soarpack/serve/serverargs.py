"""The flags an SGLang server accepts: read from the fork's `server_args.py`, or from our recorded table.

`server_args.py` is parsed with `ast` (never imported: importing it needs torch and the whole fork). Every
`parser.add_argument("--name", ...)` call gives a flag, whether it takes a value (not a `store_true`-like
action, `nargs` not 0) and its `choices` when they are a literal list. The table recorded from the fork's
`minicpm_sala` branch (`server-args-flags.json` beside the patches) stands in when no tree is at hand.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from soarpack.placement.write import atomic_write_json
from soarpack.errors import ConfigError

FLAGS_FILE = "server-args-flags.json"
SERVER_ARGS_REL = Path("sglang") / "srt" / "server_args.py"
_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


@dataclass(frozen=True)
class FlagSpec:
    takes_value: bool
    choices: Optional[Tuple[str, ...]] = None
    canonical: Optional[str] = None  # the first spelling, when this one is an alias


def _const_str(node: ast.AST) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _literal_choices(node: ast.AST, names: Dict[str, ast.AST]) -> Optional[Tuple[str, ...]]:
    if isinstance(node, ast.Name) and node.id in names:
        node = names[node.id]
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
        return tuple(str(v) for v in value)
    return None


def parse_server_args(path: os.PathLike) -> Dict[str, FlagSpec]:
    """Every long flag `server_args.py` declares (aliases included)."""
    path = Path(path)
    if path.is_dir():
        for cand in (path / SERVER_ARGS_REL, path / "python" / SERVER_ARGS_REL):
            if cand.is_file():
                path = cand
                break
    if not path.is_file():
        raise ConfigError(f"{path}: no SGLang server_args.py there", "pass the fork's python/ dir or the file itself")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: cannot parse server_args.py ({exc.msg})", "is this an SGLang tree?") from None
    names = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)}
    flags: Dict[str, FlagSpec] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        spellings = [s for s in (_const_str(a) for a in node.args) if s and s.startswith("--")]
        if not spellings:
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        action = kw.get("action")
        action_name = _const_str(action) if action is not None else None
        takes_value = action_name not in _NO_VALUE_ACTIONS
        nargs = kw.get("nargs")
        if nargs is not None and isinstance(nargs, ast.Constant) and nargs.value == 0:
            takes_value = False
        choices = _literal_choices(kw["choices"], names) if "choices" in kw else None
        for i, s in enumerate(spellings):
            flags[s] = FlagSpec(takes_value, choices, spellings[0] if i else None)
    if not flags:
        raise ConfigError(f"{path}: no parser.add_argument('--...') calls found", "is this SGLang's server_args.py?")
    return flags


def builtin_flags() -> Dict[str, FlagSpec]:
    """The table recorded from the fork (both known commits declare the same flags)."""
    from soarpack.serve.patches import patch_dir

    data = json.loads((patch_dir() / FLAGS_FILE).read_text(encoding="utf-8"))
    return {
        name: FlagSpec(spec["takes_value"], tuple(spec["choices"]) if spec.get("choices") else None, spec.get("canonical"))
        for name, spec in data["flags"].items()
    }


def known_flags(server_args_py: Optional[os.PathLike] = None) -> Dict[str, FlagSpec]:
    return parse_server_args(server_args_py) if server_args_py else builtin_flags()


def record_flags(server_args_py: os.PathLike, out: os.PathLike, source: str) -> Path:
    """Maintainer tool: write the built-in table from a fork tree."""
    flags = parse_server_args(server_args_py)
    table = {
        name: {"takes_value": s.takes_value, **({"choices": list(s.choices)} if s.choices else {}), **({"canonical": s.canonical} if s.canonical else {})}
        for name, s in sorted(flags.items())
    }
    return atomic_write_json(out, {"source": source, "flags": table})


def split_args(args) -> List[str]:
    """A SGLANG_SERVER_ARGS string or a list of tokens -> tokens."""
    if isinstance(args, str):
        try:
            return shlex.split(args)
        except ValueError as exc:
            raise ConfigError(f"cannot split the server args: {exc}", "check the quoting") from None
    return [str(a) for a in args]
