"""What an output holds: its hash, whether two outputs hold the same bytes, its inode, its published modes, and
removing a temp whatever it is (file, folder or link)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path
from typing import Dict, Optional


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (bundles hold multi-GB files)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _same_file_bytes(a: str, b: str) -> bool:
    if os.path.getsize(a) != os.path.getsize(b):
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def _tree(root: str) -> Dict[str, tuple]:
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                entries[rel] = ("link", os.readlink(p))
            elif os.path.isdir(p):
                entries[rel] = ("dir",)
            else:
                entries[rel] = ("file", os.path.getsize(p))
    return entries


def same_content(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Byte-identical files, or folders with the same names, links and file bytes (modes aside)."""
    a, b = str(a), str(b)
    if os.path.islink(a) or os.path.islink(b):
        return False
    if os.path.isfile(a) and os.path.isfile(b):
        return _same_file_bytes(a, b)
    if not (os.path.isdir(a) and os.path.isdir(b)):
        return False
    ta, tb = _tree(a), _tree(b)
    if ta != tb:
        return False
    files = sorted((e[1], rel) for rel, e in ta.items() if e[0] == "file")  # the small ones first
    return all(_same_file_bytes(os.path.join(a, rel), os.path.join(b, rel)) for _, rel in files)


def ino(path: str | os.PathLike) -> Optional[list]:
    """[device, inode] of `path` itself (a link is not followed), or None when nothing is there."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def discard(path: str | os.PathLike) -> None:
    """Remove a file, a link or a folder; nothing there is fine."""
    path = str(path)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish_permissions(root: Path) -> None:
    """Give files 0644 and folders 0755 (less the umask): temp files are created private, results are not."""
    mask = _umask()
    root = Path(root)
    if root.is_dir():
        for dirpath, dirnames, filenames in os.walk(root):
            os.chmod(dirpath, 0o755 & ~mask)
            for f in filenames:
                p = os.path.join(dirpath, f)
                if not os.path.islink(p):
                    os.chmod(p, (0o755 if os.access(p, os.X_OK) else 0o644) & ~mask)
    elif root.exists():
        os.chmod(root, 0o644 & ~mask)
