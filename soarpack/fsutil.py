"""Atomic outputs: a half-written checkpoint, tarball or report must never look complete.

Everything is written into a temporary sibling of the target and renamed into place at the end, so an
interrupted run (Ctrl-C, a full disk, a crash) leaves the old target untouched and at most a `.tmp-*` folder
that no reader mistakes for a result.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from soarpack.errors import OutputExistsError, SoarpackError


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


def _disk_full_error(target: Path, exc: OSError) -> SoarpackError:
    return SoarpackError(f"no space left on the device while writing {target}", "free disk space and run again; nothing was replaced")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (bundles hold multi-GB files)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if exc.errno == errno.ENOSPC:
            raise _disk_full_error(path, exc) from exc
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def ensure_writable_output(target: str | os.PathLike, *, what: str = "output") -> Path:
    """Fail before any work when `target` cannot be written as a file: a folder, a missing or read-only parent.

    Probes with a real temporary file beside the target, so read-only mounts and permission bits are both caught.
    """
    target = Path(target)
    if target.is_dir():
        raise SoarpackError(f"{what} {target} is a directory", "give a file path")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise SoarpackError(f"{what} {target}: the folder {parent} does not exist", "create it or choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise SoarpackError(f"{what} {target} cannot be written: {exc.strerror or exc}",
                            "choose a writable location") from None
    return target


def check_output_dir(target: str | os.PathLike, force: bool) -> Path:
    """Refuse a non-empty output directory unless force is set; return the resolved target."""
    target = Path(target)
    if target.exists():
        if not target.is_dir():
            raise OutputExistsError(f"output {target} exists and is not a directory", "choose another path")
        if any(target.iterdir()) and not force:
            raise OutputExistsError(f"output directory {target} is not empty", "pass --force to replace it")
    return target


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `target`; on success it replaces `target` in one rename.

    On any exception (KeyboardInterrupt included) the temporary directory is removed and `target` is left as it was.
    """
    target = check_output_dir(target, force)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise _disk_full_error(target, exc) from exc
        raise
    publish_permissions(tmp)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
