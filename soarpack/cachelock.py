"""Which folders of soarpack's cache are in use: a `FOLDER.lock` file beside each, flock()ed.

    building it            LOCK_EX, waiting its turn (the image stand-in's builder, soarpack.imagestack)
    using it               LOCK_SH, waiting for a build or a clear to end (check and serve-check on the image
                           stand-in, until the process exits; build and `wheels fetch` on the wheel cache)
    `soarpack cache clear` LOCK_EX without waiting: refuses while anyone builds or uses the folder

The kernel drops a flock when its holder dies, so a killed run never leaves the cache locked. The lock files stay
(empty): removing one while a builder waits on it would let a second builder lock a new file of the same name.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Dict, Iterator, List, Optional

_HELD: Dict[str, int] = {}  # lock files this process holds shared until it exits -> their fds


def lock_path(folder: Path) -> Path:
    """The lock of a cache folder: `FOLDER.lock` beside it."""
    folder = Path(folder)
    return folder.with_name(folder.name + ".lock")


def _open(lock: Path, create: bool) -> Optional[int]:
    """An fd on the lock file; None when it cannot be had (a read-only cache without one: nobody can lock it)."""
    if create:
        with contextlib.suppress(OSError):
            return os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    with contextlib.suppress(OSError):
        return os.open(lock, os.O_RDONLY)
    return None


def hold_shared(folder: Path) -> None:
    """Mark `folder` as used by this process until it exits (or `release_shared`). Waits while it is being built
    or cleared. Best effort: where the lock file cannot be made (a read-only cache), nothing is held."""
    key = str(lock_path(folder))
    if key in _HELD:
        return
    fd = _open(Path(key), create=True)
    if fd is None:
        return
    fcntl.flock(fd, fcntl.LOCK_SH)
    _HELD[key] = fd


def release_shared(folder: Path) -> None:
    fd = _HELD.pop(str(lock_path(folder)), None)
    if fd is not None:
        os.close(fd)  # closing the last fd of the open file drops its flock


@contextlib.contextmanager
def shared(folder: Path) -> Iterator[None]:
    """Mark `folder` as used for the duration of the block (best effort, as hold_shared)."""
    fd = _open(lock_path(folder), create=True)
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def try_exclusive(folder: Path) -> Optional[int]:
    """The fd of `folder`'s lock taken exclusively without waiting, or None while someone builds or uses it.
    Close the fd to release it."""
    fd = _open(lock_path(folder), create=True)
    if fd is None:
        fd = _open(lock_path(folder), create=False)
        if fd is None:
            raise OSError(f"cannot open or create {lock_path(folder)}")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def is_busy(folder: Path) -> bool:
    """Whether someone builds or uses `folder` now (a folder whose lock file does not exist is not in use)."""
    lock = lock_path(folder)
    fd = _open(lock, create=False)
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock just taken
    return False


def holders(folder: Path) -> List[str]:
    """Who holds `folder`'s lock, as 'pid N (command)', from /proc/locks (Linux); [] where it cannot be told.
    A pid from another PID namespace (a container) is shown as the kernel gives it."""
    try:
        st = os.stat(lock_path(folder))
        table = Path("/proc/locks").read_text()
    except OSError:
        return []
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    rows = [line.split() for line in table.splitlines()]
    rows = [r for r in rows if len(r) >= 6 and r[1] == "FLOCK"]  # "N: -> FLOCK ..." is a waiter, not a holder
    # An overlay filesystem (a container) reports the inode on its lower device: then match the inode alone.
    hits = [r for r in rows if r[5] == want] or [r for r in rows if r[5].rsplit(":", 1)[-1] == str(st.st_ino)]
    out = []
    for r in hits:
        pid = r[4]
        try:
            cmd = " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split())
        except OSError:
            cmd = ""
        shown = f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}"
        if shown not in out:
            out.append(shown)
    return out
