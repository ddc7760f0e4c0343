"""Liveness of temporary outputs: `.TARGET.tmp-ID.lock` beside the temp (never inside: it would ship) is flock()ed
by its owner from before the temp exists until after the old output is gone. The kernel drops the lock when the
owner dies, whatever its PID namespace, so cleanup removes exactly the temps whose lock it can take."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from soarpack.placement.owner import (owner_record, owner_state, read_incomplete_marker, read_record,
                                      write_record)

HELD: Dict[str, int] = {}  # lock files this process holds -> their fds ("self" for verify)


def _same_inode(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def new_lock(target: Path) -> tuple[str, int]:
    """A fresh `.TARGET.tmp-ID.lock` beside target, flock()ed by this process (retried if a cleaner raced us)."""
    parent = target.parent if str(target.parent) else Path(".")
    while True:
        fd, path = tempfile.mkstemp(prefix=f".{target.name}.tmp-", suffix=".lock", dir=parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if not _same_inode(fd, path):  # a cleaner took it for a dead run's lock between mkstemp and flock
            os.close(fd)
            continue
        write_record(fd, owner_record(target))
        HELD[path] = fd
        return path, fd


def release_lock(path: str) -> None:
    fd = HELD.pop(path, None)
    with contextlib.suppress(OSError):
        os.unlink(path)  # while still held: nobody can take a lock on a name that is gone
    if fd is not None:
        os.close(fd)


def take_dead_lock(path: str) -> Optional[int] | str:
    """The fd of `path` locked by us when its owner is gone; "busy" while a live process holds it; None if gone."""
    if path in HELD:
        return "busy"
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    except OSError:
        return "busy"  # unreadable: not ours to judge
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return "busy"
    if not _same_inode(fd, path):
        os.close(fd)
        return None
    return fd


def lock_state(lock_path: str | os.PathLike) -> Optional[str]:
    """"self", "running" (a live process holds the lock), "gone" (nobody does), or None (no lock file)."""
    lock_path = str(lock_path)
    if lock_path in HELD:
        return "self"
    fd = take_dead_lock(lock_path)
    if fd is None:
        return None
    if fd == "busy":
        return "running"
    os.close(fd)  # only looked: the next run for its target cleans it up
    return "gone"


def temp_owner(folder: str | os.PathLike) -> Optional[tuple[Dict[str, Any], str]]:
    """(owner record, state) when `folder` is an unfinished run's temp output, else None. The lock file beside it
    decides the state; a marker alone (a copy, or a folder made before locks) falls back to `owner_state`."""
    folder = Path(folder)
    base = str(folder)
    head, sep, tail = folder.name.rpartition(".tmp-")
    if sep and head.startswith(".") and "." in tail:  # `.OUT.tmp-ID.old`: the aside of a journaled swap
        base = str(folder.with_name(f"{head}{sep}{tail.split('.', 1)[0]}"))
    state = lock_state(f"{base}.lock")
    marker = read_incomplete_marker(folder) if folder.is_dir() else None
    if state is not None:
        return {**(marker or {}), **read_record(f"{base}.lock")}, state
    if marker is not None:
        return marker, owner_state(marker)
    return None


@contextlib.contextmanager
def folder_lock(folder: Path) -> Iterator[None]:
    """Serialize journaled swaps in one folder (flock on the folder itself: no file to leave behind)."""
    fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
