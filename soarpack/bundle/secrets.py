"""Refuse to ship anything that looks like a credential: the bundle is uploaded to a third party.

Every byte of every file is scanned (in overlapping blocks, whatever its size or suffix), and archives (wheels,
zips) are opened and their members scanned too, by name and content. The one exception is a wheel whose sha256
is pinned in the platform lock: it is the published artifact, and third-party test fixtures inside it are not ours.

The rules are hand-written, not a maintained rule set such as detect-secrets: the scan must run in `soarpack check`
with no extra installed, over binary files and archive members (detect-secrets reads text lines), and its keyword
and entropy plugins flag hashes and ids that calibration text and source trees are full of.
"""

from __future__ import annotations

import functools
import re
import zipfile
from pathlib import Path
from typing import BinaryIO, FrozenSet, Iterable, Optional

from soarpack.errors import SoarpackError

# File or folder names that are credentials (or carry them) whatever their content.
FORBIDDEN_NAMES = {
    ".git", ".netrc", "_netrc", ".pypirc", ".env", ".git-credentials", ".npmrc", ".dockercfg",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", ".huggingface", "credentials", ".aws", ".ssh",
}
FORBIDDEN_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".keystore")
# huggingface_hub keeps the login token in a pattern-less file: ~/.cache/huggingface/token (and stored_tokens).
FORBIDDEN_IN_FOLDER = {"huggingface": ("token", "stored_tokens")}
# A packed name keeps the original behind an index (calib/00-.env): the rules see through it.
_PACKED_PREFIX = re.compile(r"^\d+-")

_HF_SHORT = rb"hf_(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[A-Z])(?=[A-Za-z0-9]*[a-z])[A-Za-z0-9]{10,29}"
# Content patterns: token formats with a recognizable prefix, PEM/PGP private keys, and an AWS secret key only
# beside its name (40 base64 characters alone are as often a sha1).
SECRET_PATTERNS = [
    ("a private key", re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("a Hugging Face token", re.compile(rb"\b(?:hf_[A-Za-z0-9]{30,}|" + _HF_SHORT + rb")\b")),
    ("a GitHub token", re.compile(rb"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b")),
    ("a GitLab token", re.compile(rb"\bglpat-[A-Za-z0-9_-]{20,}")),
    ("a Google API key", re.compile(rb"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])")),
    ("an AWS access key", re.compile(rb"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("an AWS secret access key",
     re.compile(rb"(?i)aws_?secret_?(?:access_?)?key[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")),
    ("an OpenAI-style API key", re.compile(rb"\bsk-(?:proj-)?[A-Za-z0-9_-]{32,}\b")),
    ("a Slack token", re.compile(rb"\bxox[abprs]-[A-Za-z0-9-]{10,}\b")),
    ("a PyPI token", re.compile(rb"\bpypi-[A-Za-z0-9_-]{50,}\b")),
]

BLOCK_BYTES = 1 << 20
# Longer than any match the patterns need, so a secret cut by a block edge is whole in the next block.
OVERLAP_BYTES = 4096
ARCHIVE_SUFFIXES = (".whl", ".zip")
MAX_ARCHIVE_DEPTH = 3
ZIP_MAGIC = b"PK\x03\x04"


class CredentialError(SoarpackError):
    """The bundle tree holds a file that looks like a credential."""


def _refuse(name: str, problem: str) -> CredentialError:
    return CredentialError(f"refusing to bundle {name}: it {problem}",
                           "remove the file (or the secret from it) from the inputs and build again")


def name_problem(rel: str | Path) -> Optional[str]:
    """Why a path's name alone marks it as a credential, or None."""
    parts = Path(rel).parts
    for i, part in enumerate(parts):
        for name in {part, _PACKED_PREFIX.sub("", part)}:
            if name in FORBIDDEN_NAMES:
                return f"is or sits in '{name}', which holds credentials"
            if name.endswith(FORBIDDEN_SUFFIXES):
                return "has a key/certificate file extension"
            if i > 0 and name in FORBIDDEN_IN_FOLDER.get(parts[i - 1], ()):
                return f"is a {parts[i - 1]} login token file"
    return None


def find_secret(data: bytes) -> Optional[str]:
    for what, pattern in SECRET_PATTERNS:
        if pattern.search(data):
            return what
    return None


def find_secret_in_stream(fh: BinaryIO) -> Optional[str]:
    """find_secret over a whole stream of any size, in blocks that overlap by OVERLAP_BYTES."""
    tail = b""
    while True:
        block = fh.read(BLOCK_BYTES)
        if not block:
            return None
        what = find_secret(tail + block)
        if what:
            return what
        tail = (tail + block)[-OVERLAP_BYTES:]


@functools.lru_cache(maxsize=1)
def locked_wheel_digests() -> FrozenSet[str]:
    """sha256 of every published wheel pinned in the platform lock."""
    from soarpack.bundle.wheels import load_lock

    return frozenset(w.sha256 for w in load_lock() if w.sha256)


def _is_locked_wheel(path: Path) -> bool:
    from soarpack.fsutil import sha256_file

    return path.name.endswith(".whl") and sha256_file(path) in locked_wheel_digests()


def _scan_archive(zf: zipfile.ZipFile, display: str, depth: int) -> None:
    for info in zf.infolist():
        member = f"{display}!{info.filename}"
        problem = name_problem(info.filename)
        if problem:
            raise _refuse(member, problem)
        if info.is_dir():
            continue
        with zf.open(info) as fh:
            what = find_secret_in_stream(fh)
        if what:
            raise _refuse(member, f"contains what looks like {what}")
        if depth < MAX_ARCHIVE_DEPTH and info.filename.endswith(ARCHIVE_SUFFIXES):
            with zf.open(info) as fh, zipfile.ZipFile(fh) as inner:
                _scan_archive(inner, member, depth + 1)


def scan_file(path: str | Path, display: Optional[str] = None) -> None:
    """Raise CredentialError if one file (named `display` in the message) looks like, or holds, a credential."""
    path = Path(path)
    display = display or str(path)
    problem = name_problem(display) or name_problem(path.name)
    if problem:
        raise _refuse(display, problem)
    if path.is_symlink() or not path.is_file() or _is_locked_wheel(path):
        return
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if path.name.endswith(ARCHIVE_SUFFIXES) or magic == ZIP_MAGIC:  # members first: their names say more
        try:
            with zipfile.ZipFile(path) as zf:
                _scan_archive(zf, display, 1)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise CredentialError(f"cannot open the archive {display} to scan it ({exc})",
                                  "ship only archives that unzip cleanly") from None
    with open(path, "rb") as fh:
        what = find_secret_in_stream(fh)
    if what:
        raise _refuse(display, f"contains what looks like {what}")


def check_input_names(paths: Iterable[str | Path]) -> None:
    """Refuse a user-supplied file by its own name (and its link target's) before it is renamed into the bundle;
    its content is scanned in the bundle tree."""
    for path in paths:
        path = Path(path)
        for name in (path.name, path.resolve().name):
            problem = name_problem(name)
            if problem:
                raise _refuse(str(path), problem)


def scan_tree(root: str | Path) -> None:
    """Raise CredentialError naming the first file (sorted order) that looks like a credential."""
    root = Path(root)
    for path in sorted(root.rglob("*"), key=lambda p: p.as_posix()):
        rel = path.relative_to(root).as_posix()
        problem = name_problem(rel)
        if problem:
            raise _refuse(rel, problem)
        if path.is_file():
            scan_file(path, rel)
