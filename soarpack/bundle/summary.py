"""`soarpack inspect`: what a bundle holds, read from its MANIFEST.json without extracting anything.

The tarball is streamed up to the members the summary needs (MANIFEST.json, then the calibration files, which
sort before src/ and wheels/); each is checked by tarpack's member rules and a size cap before it is read.
"""

from __future__ import annotations

import tarfile
import zlib
from pathlib import Path
from typing import Any, Dict

from soarpack.bundle.manifest import MANIFEST_NAME, Manifest, manifest_json, parse_manifest
from soarpack.bundle.risks import manifest_risks
from soarpack.bundle.tarpack import UnsafeArchiveError, member_problem, require_gzip
from soarpack.errors import SoarpackError
from soarpack.quant.calib import count_rows
from soarpack.placement.content import sha256_file

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
                    manifest = parse_manifest(manifest_json(_read_member(tar, member), str(path)), str(path))
                elif manifest is not None and member.name in manifest.quantize.calib:
                    calib[member.name] = _read_member(tar, member)
                if manifest is not None and set(manifest.quantize.calib) <= set(calib):
                    break
    except FileNotFoundError:
        raise SoarpackError(f"{path} does not exist", "pass the .tar.gz that `soarpack build` wrote") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise SoarpackError(f"cannot read {path} as a tarball: {exc}", "pass the .tar.gz that `soarpack build` wrote") from None
    if manifest is None:
        raise SoarpackError(f"{path} holds no MANIFEST.json", "this is not a bundle written by `soarpack build`")
    return manifest, calib


def inspect_bundle(path: str | Path) -> Dict[str, Any]:
    """Identity, profile, recipe, calibration (rows and sources), server args, wheels, sha256, versions, the evidence
    the build recorded and the risks it implies (soarpack.bundle.risks)."""
    path = Path(path)
    manifest, calib = _read_manifest_and_calib(path)
    m: Manifest = manifest
    # Counted as quantize reads them: JSONL by suffix or content, lines ending at "\n" only; a text file is one row.
    sources = [{"file": name, "rows": count_rows(name, calib.get(name, b"").decode("utf-8", "replace"))}
               for name in m.quantize.calib]
    return {
        "id": m.id,
        "path": str(path),
        "sha256": sha256_file(path),
        "size": path.stat().st_size,
        "soarpack_version": m.soarpack_version,
        "profile": m.profile.name,
        "server_args": m.profile.args_string,
        "patches": list(m.profile.patches),
        "fallback": m.profile.fallback,
        "recipe": m.quantize.recipe_name,
        "quantize": {k: v for k, v in m.quantize.model_dump().items() if k != "calib"},
        "calibration": {"rows": sum(s["rows"] for s in sources), "sources": sources},
        "sglang": {k: getattr(m.sglang, k) for k in ("mode", "fork_commit", "applied_on")},
        "wheels": {"count": len(m.wheels.files), "source": m.wheels.source},
        "files": len(m.files),
        "evidence": m.evidence or {"recipe": [], "profile": []},
        "risks": [r.to_dict() for r in manifest_risks(m.as_json())],
    }
