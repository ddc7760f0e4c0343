"""What is under soarpack's cache (`cache_root()`: $SOARPACK_CACHE, else $XDG_CACHE_HOME/soarpack, else
~/.cache/soarpack), with sizes, and clearing it without pulling it from under a running build or check.

    image-stack/KEY   the image stand-in (soarpack.imagestack): one venv per KEY (the Python tag, the torch pin and
                      a hash of the packages); only the current KEY is used, others are left by older soarpacks
    wheels            the platform wheels that `build` bundles (soarpack.bundle.wheels), fetched once from PyPI
    gpu-serve         what tests/test_gpu_serve.py installs beside the stand-in (the fork server's extra packages)

Only what soarpack made is ever cleared: a folder that holds soarpack's marker (soarpack.cachemark, written when
soarpack creates the entry). The cache root may be a folder shared with other things ($SOARPACK_CACHE pointed at a
home or a shared folder): anything else under it, whatever its name, is listed as not soarpack's and left alone, and
an entry an older soarpack made (before markers) is left too, with the command that removes it by hand. A cache root
that is `/`, the home folder or a parent of either is refused outright.

An entry is cleared only with its lock (soarpack.cachelock) taken without waiting; all locks are taken before
anything is deleted, so a refused clear deletes nothing. A folder is first renamed to `.trash-NAME-PID`, so that an
interrupted clear never leaves a half-deleted stand-in that still looks ready; its marker is deleted last, so the
leftover is still provably soarpack's and `list` shows it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from soarpack import cachelock
from soarpack.cachemark import MARKER, marked_entry
from soarpack.errors import ConfigError, HostError
from soarpack.imagestack import cache_root, stack_dir
from soarpack.printable import printable

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


NOT_OURS = "not made by soarpack (no soarpack marker in it)"


class CacheBusyError(HostError):
    """A cache entry is being built or used by a running soarpack: clearing it now would break that run."""


class UnsafeCacheRootError(ConfigError):
    """The cache root is `/`, the home folder or a parent of either: clear refuses to work there at all."""


@dataclass
class Entry:
    name: str  # relative to the cache root: "wheels", "image-stack/cp310-torch2.9.1-da5fc56f17d9"
    path: Path
    what: str
    bytes: int
    note: str = ""  # "in use", "current", "not the current stand-in (an older soarpack's)", ...
    holders: List[str] = field(default_factory=list)  # who holds its lock now ('pid N (command)')
    kept_because: str = ""  # why `clear` leaves it (not provably soarpack's); "" = clear may delete it

    @property
    def clearable(self) -> bool:
        return not self.kept_because

    @property
    def group(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def in_use(self) -> bool:
        return bool(self.holders)

    def to_dict(self) -> Dict[str, object]:
        return {**asdict(self), "path": str(self.path), "in_use": self.in_use, "clearable": self.clearable}


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


def _trash_of(entry_name: str) -> str:
    return f"{TRASH_PREFIX}{entry_name.replace('/', '-')}-"


def remove_by_hand(path: Path) -> str:
    """The command that removes an entry clear leaves, for the user to run after looking at it."""
    return f"rm -rf -- {shlex.quote(str(path))}"


def _kept_because(name: str, path: Path) -> str:
    """Why clear must leave this entry ("" when soarpack's marker proves soarpack made it)."""
    group = name.split("/", 1)[0]
    made = marked_entry(path)
    if group.startswith(TRASH_PREFIX):
        # a leftover of an interrupted clear: the marker of the entry it was, or nothing left in it at all
        # a leftover of an interrupted clear holds the marker of the entry it was (the marker goes last)
        return "" if made is not None and name.startswith(_trash_of(made)) else NOT_OURS
    if made == name:
        return ""
    if group in WHAT:
        return ("no soarpack marker in it: an older soarpack made it before markers existed, or something else "
                "did; soarpack leaves it")
    return NOT_OURS


def _entry(name: str, path: Path, sizes: bool) -> Entry:
    group = name.split("/", 1)[0]
    kept = _kept_because(name, path)
    what = WHAT.get(group, NOT_OURS)
    note = ""
    if group.startswith(TRASH_PREFIX):
        what, note = ("left by an interrupted `soarpack cache clear`", "deleting") if not kept else (NOT_OURS, "")
    elif group == IMAGE_STACK:
        current = path == stack_dir()
        ready = (path / ".soarpack-ready.json").is_file()
        note = ("current" if current else "not the stand-in this soarpack uses (an older one's)") + \
               ("" if ready else ", not ready (its build was interrupted, or is running)")
    if what == NOT_OURS:  # not soarpack's: not walked (it may be a whole home folder), not part of the total
        sizes, note = False, "size not measured"
    entry = Entry(name, path, what, disk_usage(path) if sizes else 0, note, kept_because=kept)
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


def _homes() -> List[Path]:
    homes = []
    for home in (os.environ.get("HOME"), _passwd_home()):
        if home:
            homes.append(Path(os.path.realpath(home)))
    return homes


def _passwd_home() -> Optional[str]:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except (KeyError, OSError):
        return None


def root_problem(root: Optional[Path] = None) -> Optional[str]:
    """Why `root` must not be cleared at all: it is `/`, a home folder ($HOME, or the account's) or a parent of
    one. None when it is a folder of its own (even then only soarpack's marked entries are cleared)."""
    root = Path(root) if root is not None else cache_root()
    real = Path(os.path.realpath(root))
    if real == Path(real.anchor):
        return f"the cache root {root} is the filesystem root /"
    for home in _homes():
        if real == home:
            return f"the cache root {root} is the home folder {home}"
        if real in home.parents:
            return f"the cache root {root} is a parent of the home folder {home}"
    return None


def refuse_unsafe_root(root: Optional[Path] = None) -> None:
    """UnsafeCacheRootError when `root` (default: the cache root) is one that clear refuses (root_problem)."""
    problem = root_problem(root)
    if problem:
        raise UnsafeCacheRootError(f"not cleared: {problem}; nothing was deleted",
                                   "point SOARPACK_CACHE at a folder of soarpack's own (e.g. ~/.cache/soarpack)")


@dataclass
class Cleared:
    deleted: List[Entry]
    kept: List[Entry]  # chosen, but not provably soarpack's: left as they are


def clear(chosen: Sequence[Entry], root: Optional[Path] = None) -> Cleared:
    """Delete the chosen entries that soarpack's marker proves soarpack made; leave the others (Cleared.kept).
    Refuse (nothing deleted) a cache root that is `/`, a home folder or a parent of one (UnsafeCacheRootError),
    and while any chosen entry is built or used (CacheBusyError)."""
    refuse_unsafe_root(root)
    ours = [e for e in chosen if e.clearable]
    kept = [e for e in chosen if not e.clearable]
    held: List[int] = []
    try:
        busy = []
        for entry in ours:
            folder = _lock_of(entry)
            if folder is None:
                continue
            try:
                fd = cachelock.try_exclusive(folder)
            except OSError as exc:
                raise HostError(f"cannot lock {printable(entry.name)} to clear it ({exc})",
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
        for entry in ours:
            _delete(entry)
        return Cleared(ours, kept)
    finally:
        for fd in held:
            os.close(fd)


def _delete(entry: Entry) -> None:
    """Delete one marked entry: renamed to the trash first, its marker last (a leftover stays provably ours)."""
    path = entry.path
    if not entry.clearable:  # never reached through clear(); a guard for any other caller
        raise HostError(f"not deleting {printable(path)}: {entry.kept_because}", remove_by_hand(path))
    try:
        if not entry.group.startswith(TRASH_PREFIX):
            root = path.parents[entry.name.count("/")]  # the cache root the entry was listed under
            trash = root / f"{_trash_of(entry.name)}{os.getpid()}"
            os.rename(path, trash)
            path = trash
        for child in os.scandir(path):
            if child.name == MARKER:
                continue
            if child.is_dir(follow_symlinks=False):
                shutil.rmtree(child.path)
            else:
                os.unlink(child.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path / MARKER)
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise HostError(f"cannot delete {printable(path)} ({exc.strerror or exc})",
                        "check the cache folder's permissions") from None


def listing_lines(found: Sequence[Entry]) -> List[str]:
    """One line per entry (size, name, note, what it is), and who holds it; every name made printable."""
    lines = []
    for e in found:
        line = f"  {human(e.bytes):>9}  {printable(e.name)}" + (f"  [{printable(e.note)}]" if e.note else "") \
            + f"  {e.what}"
        if e.kept_because:
            line += "; clear leaves it" if e.what == NOT_OURS else "; no soarpack marker in it, so clear leaves it"
        lines.append(line + "".join(f"\n             held by {printable(h)}" for h in e.holders))
    return lines


def kept_lines(kept: Sequence[Entry]) -> List[str]:
    """What clear left and why, with the command that removes each by hand (after looking at it)."""
    out = []
    for e in kept:
        out.append(f"  kept {printable(e.name)}: {e.kept_because}")
        out.append(f"       to remove it by hand, look at it first, then: {printable(remove_by_hand(e.path))}")
    return out


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
