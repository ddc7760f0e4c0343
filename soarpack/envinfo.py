"""What `soarpack env` reports: the versions installed here, the CPython 3.10 soarpack would use and how it was found,
the image stand-in's state, the cache's entries and the disk free under it. Nothing is imported to learn a version
(importlib.metadata reads the installed metadata), so the report takes a moment even where torch takes seconds."""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata
from typing import Any, Dict, Optional

from soarpack.version import __version__
from soarpack.facts import image

PACKAGES = ("torch", "transformers", "gptqmodel")


def installed_version(name: str) -> Optional[str]:
    """The installed distribution's version, None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> Dict[str, Optional[str]]:
    return {"soarpack": __version__, "python": sys.version.split()[0],
            **{name: installed_version(name) for name in PACKAGES}}


def python310() -> Dict[str, Any]:
    from soarpack.imagestack import PYTHON310_SEARCH, locate_python310

    found = locate_python310()
    given = os.environ.get("SOARPACK_PYTHON310") or None
    note = None
    if given and (found is None or found[0] not in ("$SOARPACK_PYTHON310", PYTHON310_SEARCH[0])):
        note = f"SOARPACK_PYTHON310={given} is not a CPython 3.10 that runs" + (": ignored" if found else "")
    return {"path": found[1] if found else None, "found_by": found[0] if found else None,
            "searched": list(PYTHON310_SEARCH), "SOARPACK_PYTHON310": given, "note": note}


def image_stand_in() -> Dict[str, Any]:
    from soarpack import cachelock
    from soarpack.imagestack import stack_dir

    root = stack_dir()
    marker = root / ".soarpack-ready.json"
    built, stack_versions = False, None
    if marker.is_file() and (root / "bin" / "python").exists():
        try:
            stack_versions = json.loads(marker.read_text(encoding="utf-8"))["versions"]
            built = True
        except (OSError, ValueError, KeyError):
            pass
    return {"path": str(root), "key": root.name, "built": built, "versions": stack_versions,
            "pins": list(image.PIN_SPECS), "in_use_by": cachelock.holders(root) if cachelock.is_busy(root) else []}


def cache_report(sizes: bool = True) -> Dict[str, Any]:
    from soarpack.cache import entries, free_bytes
    from soarpack.imagestack import cache_root

    found = entries(sizes=sizes)
    set_by = "SOARPACK_CACHE" if os.environ.get("SOARPACK_CACHE") else \
        "XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else "default"
    return {"root": str(cache_root()), "set_by": set_by,
            "entries": [{"name": e.name, "bytes": e.bytes, "note": e.note} for e in found],
            "total_bytes": sum(e.bytes for e in found), "free_bytes": free_bytes()}


def report(sizes: bool = True) -> Dict[str, Any]:
    return {"versions": versions(), "executable": sys.executable, "python310": python310(),
            "image_stand_in": image_stand_in(), "cache": cache_report(sizes)}
