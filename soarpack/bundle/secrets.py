"""Refuse to ship anything that looks like a credential: the bundle is uploaded to a third party."""

from __future__ import annotations

import re
from pathlib import Path

from soarpack.errors import SoarpackError

# File or folder names that are credentials (or carry them) whatever their content.
FORBIDDEN_NAMES = {
    ".git", ".netrc", "_netrc", ".pypirc", ".env", ".git-credentials", ".npmrc", ".dockercfg",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", ".huggingface", "credentials", ".aws", ".ssh",
}
FORBIDDEN_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".keystore")

# Content patterns: token formats with a recognizable prefix, and PEM private keys.
SECRET_PATTERNS = [
    ("a private key", re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----")),
    ("a Hugging Face token", re.compile(rb"\bhf_[A-Za-z0-9]{30,}\b")),
    ("a GitHub token", re.compile(rb"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b")),
    ("an AWS access key", re.compile(rb"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("an OpenAI-style API key", re.compile(rb"\bsk-(?:proj-)?[A-Za-z0-9_-]{32,}\b")),
    ("a Slack token", re.compile(rb"\bxox[abprs]-[A-Za-z0-9-]{10,}\b")),
    ("a PyPI token", re.compile(rb"\bpypi-[A-Za-z0-9_-]{50,}\b")),
]

# Wheels and tarballs are compressed third-party artifacts; scanning them yields noise, not secrets of ours.
SKIP_CONTENT_SUFFIXES = (".whl", ".tar.gz", ".zip", ".so", ".safetensors", ".bin", ".pt")
MAX_SCAN_BYTES = 8 * 1024 * 1024


class CredentialError(SoarpackError):
    """The bundle tree holds a file that looks like a credential."""


def _name_problem(rel: Path) -> str | None:
    for part in rel.parts:
        if part in FORBIDDEN_NAMES:
            return f"is or sits in '{part}', which holds credentials"
    if rel.name.endswith(FORBIDDEN_SUFFIXES):
        return "has a key/certificate file extension"
    return None


def find_secret(data: bytes) -> str | None:
    for what, pattern in SECRET_PATTERNS:
        if pattern.search(data):
            return what
    return None


def scan_tree(root: str | Path) -> None:
    """Raise CredentialError naming the first file (sorted order) that looks like a credential."""
    root = Path(root)
    for path in sorted(root.rglob("*"), key=lambda p: p.as_posix()):
        rel = path.relative_to(root)
        problem = _name_problem(rel)
        if problem is None and path.is_file() and not path.is_symlink() and not path.name.endswith(SKIP_CONTENT_SUFFIXES):
            with open(path, "rb") as fh:
                what = find_secret(fh.read(MAX_SCAN_BYTES))
            if what:
                problem = f"contains what looks like {what}"
        if problem:
            raise CredentialError(
                f"refusing to bundle {rel.as_posix()}: it {problem}",
                "remove the file (or the secret from it) from the inputs and build again",
            )
