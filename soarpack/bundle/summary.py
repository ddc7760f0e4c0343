"""`soarpack inspect`: what a bundle holds, read from its MANIFEST.json without extracting anything.

The tarball is streamed up to the members the summary needs (MANIFEST.json, then the calibration files, which
sort before src/ and wheels/); each is checked by tarpack's member rules and a size cap before it is read.
"""

from __future__ import annotations

import json
import tarfile
import zlib
from pathlib import Path
from typing import Any, Dict

from soarpack.bundle.manifest import MANIFEST_NAME, manifest_problem
from soarpack.bundle.tarpack import UnsafeArchiveError, member_problem, require_gzip
from soarpack.errors import SoarpackError
from soarpack.quant.calib import count_rows
from soarpack.fsutil import sha256_file

MAX_MEMBER_BYTES = 64 * 2**20  # MANIFEST.json is a few kB; a calibration file a few MB


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    problem = member_problem(member)
    if problem or not member.isreg():
        raise UnsafeArchiveError(f"unsafe tarball member {member.name!r}: it {problem or 'is not a regular file'}",
                                 "rebuild the bundle with `soarpack build`")
    if member.size > MAX_MEMBER_BYTES:
        raise UnsafeArchiveError(f"{member.name} is {member.size / 2**20:.0f} MiB, over {MAX_MEMBER_BYTES // 2**20} MiB",
                                 "this is not a bundle written by `soarpack build`")
    return tar.extractfile(member).read()


def _read_manifest_and_calib(path: Path) -> tuple:
    manifest, calib = None, {}
    try:
        require_gzip(path)
        with tarfile.open(path, "r|gz") as tar:
            for member in tar:
                if member.name == MANIFEST_NAME:
                    try:
                        manifest = json.loads(_read_member(tar, member).decode("utf-8"))
                    except (ValueError, UnicodeDecodeError) as exc:
                        raise SoarpackError(f"{path}: MANIFEST.json is not valid JSON ({exc})",
                                            "rebuild the bundle with `soarpack build`") from None
                    problem = manifest_problem(manifest)
                    if problem:
                        raise SoarpackError(f"{path}: MANIFEST.json {problem}", "rebuild the bundle with `soarpack build`")
                elif manifest is not None and member.name in manifest.get("quantize", {}).get("calib", []):
                    calib[member.name] = _read_member(tar, member)
                if manifest is not None and set(manifest.get("quantize", {}).get("calib", [])) <= set(calib):
                    break
    except FileNotFoundError:
        raise SoarpackError(f"{path} does not exist", "pass the .tar.gz that `soarpack build` wrote") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise SoarpackError(f"cannot read {path} as a tarball: {exc}", "pass the .tar.gz that `soarpack build` wrote") from None
    if manifest is None:
        raise SoarpackError(f"{path} holds no MANIFEST.json", "this is not a bundle written by `soarpack build`")
    return manifest, calib


def inspect_bundle(path: str | Path) -> Dict[str, Any]:
    """Profile, recipe, calibration (rows and sources), server args, wheels, sha256 and versions of a bundle."""
    path = Path(path)
    manifest, calib = _read_manifest_and_calib(path)
    profile = manifest.get("profile") or {}
    quantize = manifest.get("quantize") or {}
    wheels = manifest.get("wheels") or {}
    # Counted as quantize reads them: JSONL by suffix or content, lines ending at "\n" only; a text file is one row.
    sources = [{"file": name, "rows": count_rows(name, calib.get(name, b"").decode("utf-8", "replace"))}
               for name in quantize.get("calib", [])]
    return {
        "path": str(path),
        "sha256": sha256_file(path),
        "size": path.stat().st_size,
        "soarpack_version": manifest.get("soarpack_version"),
        "profile": profile.get("name"),
        "server_args": profile.get("args_string"),
        "patches": profile.get("patches", []),
        "fallback": profile.get("fallback"),
        "recipe": quantize.get("recipe_name") or quantize.get("recipe"),
        "quantize": {k: v for k, v in quantize.items() if k != "calib"},
        "calibration": {"rows": sum(s["rows"] for s in sources), "sources": sources},
        "sglang": {k: (manifest.get("sglang") or {}).get(k) for k in ("mode", "fork_commit", "applied_on")},
        "wheels": {"count": len(wheels.get("files", [])), "source": wheels.get("source")},
        "files": len(manifest.get("files", {})),
        "content_sha256": manifest.get("content_sha256"),
    }
