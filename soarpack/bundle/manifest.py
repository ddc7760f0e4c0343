"""MANIFEST.json: what a bundle holds and where it came from, with a sha256 and size for every file."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from soarpack.bundle.tarpack import iter_tree
from soarpack.errors import SoarpackError
from soarpack.fsutil import sha256_file

MANIFEST_NAME = "MANIFEST.json"
MANIFEST_FORMAT = 1


def file_table(root: Path) -> dict[str, dict[str, Any]]:
    """{relative posix name: {sha256, size}} for every regular file under root except the manifest itself."""
    table = {}
    for path in iter_tree(root):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME or path.is_symlink() or not path.is_file():
            continue
        table[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return table


def bundle_path_problem(name: Any) -> str | None:
    """Why a path the manifest names cannot be a file of the bundle (absolute, or leaving it); None when fine.
    preprocess_model.py applies the same rule with the standard library only."""
    if not isinstance(name, str) or not name:
        return "is not a relative path"
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or name.startswith("\\"):
        return "is an absolute path: a bundle names only its own files"
    if ".." in PurePosixPath(name).parts:
        return "leaves the bundle ('..'): a bundle names only its own files"
    return None


def render_manifest(root: Path, meta: dict[str, Any]) -> dict[str, Any]:
    files = file_table(root)
    return {"format": MANIFEST_FORMAT, **meta, "files": files, "total_size": sum(f["size"] for f in files.values())}


# The shape of the fields soarpack reads back from a MANIFEST.json (section, key, what it must be). A hand-edited
# or foreign manifest is then one line naming the field, never an AttributeError deep inside check or inspect.
_STR_OR_NONE = (str, type(None))
_SHAPE = (
    ("profile", "name", _STR_OR_NONE), ("profile", "args_string", _STR_OR_NONE),
    ("profile", "fallback_args", _STR_OR_NONE), ("profile", "args", "strings"), ("profile", "patches", "strings"),
    ("quantize", "recipe", _STR_OR_NONE), ("quantize", "recipe_name", _STR_OR_NONE),
    ("quantize", "calib", "strings"), ("quantize", "held_out", "strings"), ("quantize", "extra_args", "strings"),
    ("sglang", "mode", _STR_OR_NONE), ("sglang", "patches", "strings"),
    ("wheels", "files", "strings"), ("wheels", "source", _STR_OR_NONE),
)


def _is_strings(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value))


def manifest_problem(data: Any) -> str | None:
    """What in a parsed MANIFEST.json does not have the shape `soarpack build` writes, or None."""
    if not isinstance(data, dict):
        return f"is a JSON {type(data).__name__}, not an object"
    files = data.get("files")
    if not isinstance(files, dict):
        return "has no 'files' table"
    for name, entry in files.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("sha256"), str)
                and isinstance(entry.get("size"), int) and not isinstance(entry.get("size"), bool)):
            return f"lists {name!r} without a sha256 string and an integer size"
    for top in ("soarpack_version", "content_sha256"):
        if not isinstance(data.get(top), _STR_OR_NONE):
            return f"has '{top}' {data[top]!r}, not a string"
    for section in ("profile", "quantize", "sglang", "wheels"):  # every bundle `soarpack build` writes has them
        if section not in data:
            return f"has no '{section}' section"
        if not isinstance(data[section], dict):
            return f"has '{section}' {data[section]!r}, not an object"
    for section, key, kind in _SHAPE:
        value = (data.get(section) or {}).get(key)
        if kind == "strings" and not _is_strings(value):
            return f"has '{section}.{key}' {value!r}, not a list of strings"
        if kind != "strings" and not isinstance(value, kind):
            return f"has '{section}.{key}' {value!r}, not a string"
    return None


def read_manifest(root: Path) -> dict[str, Any]:
    path = Path(root) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SoarpackError(f"{path} is missing", "this is not a bundle written by `soarpack build`") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SoarpackError(f"{path} is not valid JSON: {exc}", "rebuild the bundle with `soarpack build`") from exc
    problem = manifest_problem(data)
    if problem:
        raise SoarpackError(f"{path} {problem}", "rebuild the bundle with `soarpack build`")
    return data


def verify_files(root: Path, manifest: dict[str, Any]) -> list[str]:
    """Problems (one line each) between the tree under root and the manifest's file table; empty when they agree."""
    root = Path(root)
    actual = file_table(root)
    expected = manifest["files"]
    problems = []
    for rel in sorted(set(expected) - set(actual)):
        problems.append(f"{rel}: listed in the manifest but missing")
    for rel in sorted(set(actual) - set(expected)):
        problems.append(f"{rel}: present but not in the manifest")
    for rel in sorted(set(actual) & set(expected)):
        if actual[rel] != expected[rel]:
            problems.append(f"{rel}: sha256/size differ from the manifest")
    return problems
