"""What is under soarpack's cache (`cache_root()`: $SOARPACK_CACHE, else $XDG_CACHE_HOME/soarpack, else
~/.cache/soarpack), with sizes, and clearing it without pulling it from under a running build or check.

    image-stack/KEY   the image stand-in (soarpack.imagestack): one venv per KEY (the Python tag, the torch pin and
                      a hash of the packages); only the current KEY is used, others are left by older soarpacks
    wheels            the platform wheels that `build` bundles (soarpack.bundle.wheels), fetched once from PyPI
    gpu-serve         what tests/test_gpu_serve.py installs beside the stand-in (the fork server's extra packages)

An entry is cleared only with its lock (soarpack.cachelock) taken without waiting; all locks are taken before
anything is deleted, so a refused clear deletes nothing. A folder is first renamed to `.trash-NAME-PID`, so that an
interrupted clear never leaves a half-deleted stand-in that still looks ready; `list` shows such leftovers.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from soarpack import cachelock
from soarpack.errors import ConfigError, HostError
from soarpack.imagestack import cache_root, stack_dir

IMAGE_STACK = "image-stack"
WHEELS = "wheels"
TRASH_PREFIX = ".trash-"
WHAT = {
    IMAGE_STACK: "the image stand-in (CPython 3.10 with the platform image's pins) that check rehearses on",
    WHEELS: "the platform wheels that build puts in a bundle (fetched once from PyPI)",
    "gpu-serve": "what tests/test_gpu_serve.py installs beside the image stand-in",
}
# The entries whose users take their lock (the others have none to honour).
_LOCKED_BY_USERS = (IMAGE_STACK, WHEELS)


class CacheBusyError(HostError):
    """A cache entry is being built or used by a running soarpack: clearing it now would break that run."""


@dataclass
class Entry:
    name: str  # relative to the cache root: "wheels", "image-stack/cp310-torch2.9.1-da5fc56f17d9"
    path: Path
    what: str
    bytes: int
    note: str = ""  # "in use", "current", "not the current stand-in (an older soarpack's)", ...
    holders: List[str] = field(default_factory=list)  # who holds its lock now ('pid N (command)')

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def in_use(self) -> bool:
        return bool(self.holders)

    def to_dict(self) -> Dict[str, object]:
        return {**asdict(self), "path": str(self.path), "in_use": self.in_use}


def disk_usage(path: Path) -> int:
    """Bytes `path` takes on disk, like `du`: links are not followed, a hard-linked file counts once."""
    seen = set()
    total = 0
    stack = [Path(path)]
    while stack:
        p = stack.pop()
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
        if os.path.isdir(p) and not os.path.islink(p):
            try:
                stack.extend(Path(e.path) for e in os.scandir(p))
            except OSError:
                continue
    return total


def _lock_of(entry: Entry) -> Optional[Path]:
    """The folder whose lock guards `entry` (None: nothing locks it)."""
    return entry.path if entry.group in _LOCKED_BY_USERS and not entry.name.startswith(TRASH_PREFIX) else None


def _entry(name: str, path: Path, sizes: bool) -> Entry:
    group = name.split("/", 1)[0]
    what = WHAT.get(group, "not made by this soarpack")
    note = ""
    if group.startswith(TRASH_PREFIX):
        what, note = "left by an interrupted `soarpack cache clear`", "deleting"
    elif group == IMAGE_STACK:
        current = path == stack_dir()
        ready = (path / ".soarpack-ready.json").is_file()
        note = ("current" if current else "not the stand-in this soarpack uses (an older one's)") + \
               ("" if ready else ", not ready (its build was interrupted, or is running)")
    entry = Entry(name, path, what, disk_usage(path) if sizes else 0, note)
    if _lock_of(entry) is not None and cachelock.is_busy(path):
        entry.holders = cachelock.holders(path) or ["a running soarpack (its pid cannot be read here)"]
        entry.note = "in use" + (f"; {entry.note}" if entry.note else "")
    return entry


def entries(sizes: bool = True, root: Optional[Path] = None) -> List[Entry]:
    """Every entry of the cache, the image stand-ins one by one; lock files are not entries (they stay)."""
    root = Path(root) if root is not None else cache_root()
    if not root.is_dir():
        return []
    out = []
    for child in sorted(root.iterdir()):
        if child.name.endswith(".lock"):
            continue
        if child.name == IMAGE_STACK and child.is_dir() and not child.is_symlink():
            out += [_entry(f"{IMAGE_STACK}/{s.name}", s, sizes) for s in sorted(child.iterdir())
                    if not s.name.endswith(".lock")]
        else:
            out.append(_entry(child.name, child, sizes))
    return out


def select(all_entries: Sequence[Entry], what: Iterable[str]) -> List[Entry]:
    """The entries named: a group (`image-stack`, `wheels`, ...), an entry (`image-stack/KEY`), `stale` (image
    stand-ins this soarpack does not use, and leftovers of interrupted clears) or `all`; nothing named is `all`."""
    what = list(what) or ["all"]
    known = sorted({e.group for e in all_entries} | {e.name for e in all_entries})
    chosen: List[Entry] = []
    for word in what:
        word = word.strip().rstrip("/")
        if word == "all":
            hits = list(all_entries)
        elif word == "stale":
            hits = [e for e in all_entries if e.group.startswith(TRASH_PREFIX)
                    or (e.group == IMAGE_STACK and e.path != stack_dir())]
        else:
            hits = [e for e in all_entries if word in (e.name, e.group)]
            if not hits:
                raise ConfigError(f"nothing in the cache is called {word!r}",
                                  "name one of: " + ", ".join(["all", "stale", *known]) + " (soarpack cache list)")
        chosen += [e for e in hits if e not in chosen]
    return chosen


def clear(chosen: Sequence[Entry]) -> List[Entry]:
    """Delete the chosen entries; refuse (CacheBusyError, nothing deleted) while any is built or used."""
    held: List[int] = []
    try:
        busy = []
        for entry in chosen:
            folder = _lock_of(entry)
            if folder is None:
                continue
            try:
                fd = cachelock.try_exclusive(folder)
            except OSError as exc:
                raise HostError(f"cannot lock {entry.name} to clear it ({exc})",
                                "check the cache folder's permissions") from None
            if fd is None:
                busy.append(entry)
            else:
                held.append(fd)
        if busy:
            # The lock is free again between our probe and this read only if the run just ended: say what we saw.
            who = "; ".join(f"{e.name} by {', '.join(cachelock.holders(e.path) or ['a running soarpack'])}"
                            for e in busy)
            raise CacheBusyError(f"not cleared: in use ({who}); nothing was deleted",
                                 "wait for that build or check to end (or stop it), then clear again")
        for entry in chosen:
            _delete(entry)
        return list(chosen)
    finally:
        for fd in held:
            os.close(fd)


def _delete(entry: Entry) -> None:
    path = entry.path
    try:
        if path.is_dir() and not path.is_symlink():
            if not entry.group.startswith(TRASH_PREFIX):
                root = path.parents[entry.name.count("/")]  # the cache root the entry was listed under
                trash = root / f"{TRASH_PREFIX}{entry.name.replace('/', '-')}-{os.getpid()}"
                os.rename(path, trash)
                path = trash
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise HostError(f"cannot delete {path} ({exc.strerror or exc})", "check the cache folder's permissions") from None


def free_bytes(root: Optional[Path] = None) -> Optional[int]:
    """Free bytes on the filesystem of the cache (of its nearest existing parent when it does not exist yet)."""
    p = Path(root) if root is not None else cache_root()
    for candidate in (p, *p.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def human(n: Optional[int]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"
