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


def read_manifest(root: Path) -> dict[str, Any]:
    path = Path(root) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SoarpackError(f"{path} is missing", "this is not a bundle written by `soarpack build`") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SoarpackError(f"{path} is not valid JSON: {exc}", "rebuild the bundle with `soarpack build`") from exc
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise SoarpackError(f"{path} has no 'files' table", "rebuild the bundle with `soarpack build`")
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
