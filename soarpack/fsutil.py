"""Outputs: never over an input, never half there, never a moment without one.

Every writer stages its output in a temporary sibling of the target and hands it to `placing`/`place` (the one
placement step), so an interrupted run (Ctrl-C, a full disk, SIGKILL) leaves the old target or the new one, and at
most a `.TARGET.tmp-*` that no reader mistakes for a result and that the next run removes once its lock is free.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import platform
import shutil
import socket
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

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


def is_disk_full(exc: BaseException) -> bool:
    """An OSError ENOSPC, or a library's wrapper of one (safetensors reports it as text with "os error 28")."""
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    if isinstance(exc, SoarpackError):
        return False
    text = str(exc)
    return "os error 28" in text or "No space left on device" in text


def _replaces_nothing(path: Path) -> bool:
    return not os.path.lexists(path) or (path.is_dir() and not path.is_symlink() and not any(path.iterdir()))


def refuse_overlap(output: str | os.PathLike, inputs: Iterable[str | os.PathLike], *, what: str = "output") -> None:
    """Inputs are sacred: refuse an output that is an input, contains one, or would replace something inside one
    (links resolved). A new output inside an input (`quantize tin tin/quant`) deletes nothing and is allowed."""
    out = Path(os.path.realpath(output))
    for inp in inputs:
        real = Path(os.path.realpath(inp))
        if out == real:
            relation = "is"
        elif real in out.parents:
            if _replaces_nothing(Path(output)):
                continue
            relation = "would replace something inside"
        elif out in real.parents:
            relation = "contains"
        else:
            continue
        raise SoarpackError(f"{what} {output} {relation} the input {inp}",
                            "choose an output outside every input; an input is never replaced or written into")


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (bundles hold multi-GB files)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def ensure_writable_output(target: str | os.PathLike, *, what: str = "output",
                           inputs: Iterable[str | os.PathLike] = (), make_parent: bool = False,
                           replaced: Iterable[str | os.PathLike] = ()) -> Path:
    """Fail before any work when `target` cannot be written as a file: a folder, a missing (unless make_parent) or
    read-only parent, one of `inputs` (see refuse_overlap), or a path inside a folder the run `replaced` at its end
    (a log inside the checkpoint it writes would vanish with the old checkpoint).

    Probes with a real temporary file beside the target, so read-only mounts and permission bits are both caught.
    """
    target = Path(target)
    refuse_overlap(target, inputs, what=what)
    real = Path(os.path.realpath(target))
    for folder in replaced:
        if Path(os.path.realpath(folder)) in real.parents:
            raise SoarpackError(f"{what} {target} is inside {folder}, which this run replaces when it ends",
                                f"write it beside {folder} instead (or anywhere outside it)")
    if target.is_dir():
        raise SoarpackError(f"{what} {target} is a directory", "give a file path")
    parent = target.parent if str(target.parent) else Path(".")
    if make_parent and not parent.exists():
        with contextlib.suppress(OSError):  # a failure is reported below, as a missing or unwritable folder
            parent.mkdir(parents=True)
    if not parent.is_dir():
        raise SoarpackError(f"{what} {target}: the folder {parent} does not exist", "create it or choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.probe-", dir=parent)
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):  # a cleanup may take a probe for a killed run's
            os.unlink(probe)
    except OSError as exc:
        raise SoarpackError(f"{what} {target} cannot be written: {exc.strerror or exc}",
                            "choose a writable location") from None
    return target


def _probe_writable_folder(folder: Path, target: Path, what: str) -> None:
    """Create and remove a temp folder in `folder`, or in its nearest existing ancestor (nothing is left behind)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        probe = tempfile.mkdtemp(prefix=f".{target.name}.probe-", dir=existing)
        with contextlib.suppress(FileNotFoundError):  # a cleanup may take a probe for a killed run's
            os.rmdir(probe)
    except OSError as exc:
        raise SoarpackError(f"{what} {target} cannot be written: {exc.strerror or exc}",
                            "choose a writable location") from None


# -- placement: the one way an output reaches its final name --------------------------------------------------------
# Every writer stages its output beside the target (`.TARGET.tmp-ID`, a file or a folder) and hands it to `place`,
# which refuses an input or an existing output (unless forced) at that very moment, says "up to date" for the same
# bytes, and swaps without a moment where TARGET is missing or half there:
#   - a new file arrives by link() (or RENAME_NOREPLACE), so two writers to one name cannot both create it;
#   - a file replaces a file in one rename(2);
#   - a folder replaces a folder by renameat2(RENAME_EXCHANGE); where the filesystem lacks it, by two renames under
#     a journal (`.TARGET.tmp-ID.journal`) that the next run rolls back or forward.
# Liveness: `.TARGET.tmp-ID.lock` beside the temp (never inside: it would ship) is flock()ed by the owner from before
# the temp exists until after the old output is gone. The kernel drops the lock when the owner dies, whatever its
# PID namespace, so cleanup removes exactly the temps whose lock it can take.

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_RENAMEAT2_SYSCALL = {"x86_64": 316, "aarch64": 276}


def _load_renameat2() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    fn = getattr(libc, "renameat2", None)  # glibc 2.28+
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return fn
    number, syscall = _RENAMEAT2_SYSCALL.get(platform.machine()), getattr(libc, "syscall", None)
    if number is None or syscall is None:
        return None
    syscall.restype = ctypes.c_long
    return lambda a, b, c, d, flags: syscall(ctypes.c_long(number), ctypes.c_int(a), ctypes.c_char_p(b),
                                              ctypes.c_int(c), ctypes.c_char_p(d), ctypes.c_uint(flags))


_RENAMEAT2 = _load_renameat2()
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}


def renameat2(src: str | os.PathLike, dst: str | os.PathLike, flags: int) -> None:
    """rename(2) with RENAME_NOREPLACE or RENAME_EXCHANGE; OSError EINVAL/ENOSYS where kernel or filesystem lack it."""
    if _RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available here", str(src))
    if _RENAMEAT2(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(src), None, str(dst))


_HELD: Dict[str, int] = {}  # lock files this process holds -> their fds ("self" for verify)
_SAID: set = set()  # cleanup lines already printed by this process: each is said once, not once per phase


def _say_once(log: Callable[[str], None], message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        log(message)


def _write_record(fd: int, record: Dict[str, Any]) -> None:
    data = (json.dumps(record) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _read_record(path: str | os.PathLike) -> Dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _same_inode(fd: int, path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)


def _new_lock(target: Path) -> tuple[str, int]:
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
        _write_record(fd, _owner_record(target))
        _HELD[path] = fd
        return path, fd


def _release_lock(path: str) -> None:
    fd = _HELD.pop(path, None)
    with contextlib.suppress(OSError):
        os.unlink(path)  # while still held: nobody can take a lock on a name that is gone
    if fd is not None:
        os.close(fd)


def _take_dead_lock(path: str) -> Optional[int] | str:
    """The fd of `path` locked by us when its owner is gone; "busy" while a live process holds it; None if gone."""
    if path in _HELD:
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


def _discard(path: str | os.PathLike) -> None:
    path = str(path)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _ino(path: str | os.PathLike) -> Optional[list]:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


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


@dataclass
class Placed:
    """Where an output went and how: "created", "replaced", or "up-to-date" (the same bytes were already there)."""

    path: Path
    outcome: str

    @property
    def up_to_date(self) -> bool:
        return self.outcome == "up-to-date"

    def says(self) -> str:
        if self.up_to_date:
            return f"{self.path} is up to date (the same bytes were already there)"
        return f"{'replaced' if self.outcome == 'replaced' else 'wrote'} {self.path}"


class Staging:
    """A temporary file or folder beside `target`, owned through its lock file; see `placing`."""

    def __init__(self, target: Path, kind: str):
        if kind not in ("file", "dir"):
            raise ValueError(kind)
        self.target, self.kind = target, kind
        self.lock_path, self.lock_fd = _new_lock(target)
        self.path = Path(self.lock_path[: -len(".lock")])
        self.placed: Optional[Placed] = None
        try:
            if kind == "dir":
                os.mkdir(self.path, 0o700)
            else:
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except BaseException:
            _release_lock(self.lock_path)
            raise

    def note(self, **fields: Any) -> None:
        """Record how far the placement went, in the lock file: what the next run reads if this one dies."""
        _write_record(self.lock_fd, {**_owner_record(self.target), **fields})

    def release(self) -> None:
        _discard(self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.journal_path)
        _release_lock(self.lock_path)

    @property
    def journal_path(self) -> str:
        return f"{self.path}.journal"


def _replaceable(target: Path, force: bool) -> bool:
    return force or (target.is_dir() and not target.is_symlink() and not any(target.iterdir()))


def place(st: Staging, *, force: bool = False, inputs: Iterable[str | os.PathLike] = (), what: str = "output") -> Placed:
    """Move the complete staged output to its target: the one placement step every writer goes through.

    Refuses an input (or anything inside or around one) and an existing target with other content unless `force`,
    both at this moment; the same bytes already at the target are "up-to-date" and nothing moves."""
    target = st.target
    refuse_overlap(target, list(inputs), what=what)
    for _ in range(3):  # a writer racing us may create the target between the check and our link
        if os.path.lexists(target):
            if same_content(st.path, target):
                _discard(st.path)
                return Placed(target, "up-to-date")
            if not _replaceable(target, force):
                raise OutputExistsError(f"{what} {target} exists with other content",
                                        "pass --force to replace it, or choose another path")
            if (st.kind == "dir") != (target.is_dir() and not target.is_symlink()):
                raise SoarpackError(f"{what} {target} is {'not ' if st.kind == 'dir' else ''}a directory",
                                    "remove it or choose another path")
            _replace(st)
            return Placed(target, "replaced")
        if _create(st):
            return Placed(target, "created")
    raise OutputExistsError(f"{what} {target} keeps being replaced by another writer", "run one writer at a time")


def _create(st: Staging) -> bool:
    """Give the staged output the target's name only if that name is free; False if it was taken meanwhile."""
    src, dst = str(st.path), str(st.target)
    st.note(state="placing", new=_ino(src), old=None)
    if st.kind == "file":
        try:
            os.link(src, dst)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        else:
            os.unlink(src)
            return True
    try:
        renameat2(src, dst, RENAME_NOREPLACE)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
    with _folder_lock(st.target.parent):  # no hard links and no renameat2 (rare): check and rename, serialized
        if os.path.lexists(dst):
            return False
        os.rename(src, dst)
    return True


def _replace(st: Staging) -> None:
    src, dst = str(st.path), str(st.target)
    st.note(state="placing", new=_ino(src), old=_ino(dst))
    if st.kind == "file":
        os.replace(src, dst)  # one rename: the target is the old file or the new one, never neither
        return
    try:
        renameat2(src, dst, RENAME_EXCHANGE)
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
        with _folder_lock(st.target.parent):
            _journaled_swaps(st.journal_path, [(dst, src, f"{src}.old")], kind="dir")
        return
    _discard(src)  # the old output, now under the temp's name


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """Serialize journaled swaps in one folder (flock on the folder itself: no file to leave behind)."""
    fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# -- the journal: several renames that must look like one --------------------------------------------------------


def _write_journal(path: str, journal: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(journal) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _journaled_swaps(journal_path: str, swaps: List[tuple], *, kind: str) -> None:
    """Replace each target by its staged new version, all or nothing: (target, staged, aside) per swap.

    Files keep their old version by a hard link at `aside` and are then replaced in one rename each; a folder is
    renamed to `aside`, then the staged folder to its name. The journal says which step was reached, so an error
    here, or the next run after a kill (`_recover_journal`), puts every old version back, or, once committed,
    only removes the asides."""
    journal = {"kind": kind, "state": "replacing",
               "swaps": [{"target": t, "staged": s, "aside": a, "existed": os.path.lexists(t)} for t, s, a in swaps]}
    _write_journal(journal_path, journal)
    current = None
    try:
        for t, s, a in swaps:
            current = t
            if kind == "file":
                if os.path.lexists(t):
                    _keep_aside(t, a)
                os.replace(s, t)
            else:
                os.rename(t, a)
                os.rename(s, t)
        current = None
        journal["state"] = "committed"
        _write_journal(journal_path, journal)
    except BaseException as exc:
        _undo(journal)
        with contextlib.suppress(OSError):
            os.unlink(journal_path)
        if isinstance(exc, OSError) and current is not None and not is_disk_full(exc):
            raise OSError(exc.errno, exc.strerror, current) from exc  # name the file that refused, not our temp
        raise
    for t, s, a in swaps:
        _discard(a)
    os.unlink(journal_path)


def _keep_aside(target: str, aside: str) -> None:
    try:
        os.link(target, aside)  # the old version stays in place until its replacement lands
    except FileExistsError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        shutil.copy2(target, aside)


def _undo(journal: Dict[str, Any]) -> None:
    """Put every old version back (the journal was not committed); staged leftovers go. A swap whose staged
    version still exists never reached its target (each final rename is atomic)."""
    for swap in reversed(journal["swaps"]):
        t, s, a = swap["target"], swap["staged"], swap["aside"]
        replaced = not os.path.lexists(s)
        if journal["kind"] == "file":
            if replaced and os.path.lexists(a):
                os.replace(a, t)
            elif replaced and not swap["existed"] and os.path.lexists(t):
                os.unlink(t)
            _discard(a)
        elif os.path.lexists(a):
            if replaced:
                os.rename(t, s)
            os.rename(a, t)
        _discard(s)


def _recover_journal(path: str) -> str:
    """Finish a dead run's journal: back to the old versions, or forward when it had committed (or, for a folder,
    when the new one is in place and only the old one's removal was left). Returns what happened, for the log."""
    journal = _read_record(path)
    swaps = journal.get("swaps") or []
    targets = ", ".join(s["target"] for s in swaps) or "?"
    forward = journal.get("state") == "committed" or (
        journal.get("kind") == "dir" and swaps and all(not os.path.lexists(s["staged"]) and os.path.lexists(s["target"])
                                                      for s in swaps))
    if not swaps or journal.get("state") not in ("replacing", "committed", "staging"):
        result = f"an unreadable journal {path}; nothing was moved"
    elif forward:
        for s in swaps:
            _discard(s["aside"])
            _discard(s["staged"])
        result = f"rolled forward: {targets} {'is' if len(swaps) == 1 else 'are'} the new version"
    else:
        _undo(journal)
        result = f"rolled back: {targets} {'is' if len(swaps) == 1 else 'are'} the old version again"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{path}.tmp")
    return result


def replace_files(contents: Dict[Path, bytes], *, beside: Optional[Path] = None) -> None:
    """Replace several existing files all or nothing, each keeping its mode; `beside` (default: the first file's
    folder) is the tree whose `.NAME.tmp-ID.lock` and `.journal` hold the run, read by `remove_stale_temps(beside)`.

    New files are staged beside their targets, then swapped in under a journal: an error rolls back at once, a
    kill is rolled back (or forward, once committed) by the next run. No file is ever half-written or missing."""
    if not contents:
        return
    anchor = Path(beside) if beside is not None else next(iter(contents)).parent
    lock_path, _ = _new_lock(anchor)
    base = lock_path[: -len(".lock")]
    tag = os.path.basename(base).rsplit(".tmp-", 1)[1]
    journal_path = f"{base}.journal"
    swaps = [(str(t), str(t.with_name(f".{t.name}.new-{tag}")), str(t.with_name(f".{t.name}.old-{tag}")))
             for t in contents]
    try:
        # Named in the journal before they exist: a kill while staging leaves nothing the next run cannot find.
        _write_journal(journal_path, {"kind": "file", "state": "staging", "swaps": [
            {"target": t, "staged": s, "aside": a, "existed": True} for t, s, a in swaps]})
        for (t, s, _), data in zip(swaps, contents.values()):
            fd = os.open(s, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(s, stat.S_IMODE(os.stat(t).st_mode))
        _journaled_swaps(journal_path, swaps, kind="file")
    except BaseException as exc:
        for _, s, _ in swaps:
            _discard(s)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(journal_path)
        _release_lock(lock_path)
        if is_disk_full(exc):
            raise _disk_full_error(anchor, exc) from exc
        raise
    _release_lock(lock_path)


# -- temporary outputs of unfinished runs ------------------------------------------------------------------------
# A run killed with SIGKILL (or a power cut) cannot clean up: its `.OUT.tmp-ID` may hold a complete-looking
# checkpoint. Its lock file says whether the owner still lives; the marker inside a folder says what it is, so
# `verify` of a copied temp folder still says it is not a result.

INCOMPLETE_MARKER = ".soarpack-incomplete"


def _boot_id() -> Optional[str]:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _process_start(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid from its first owner."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
        return int(stat_line.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner_record(target: Path) -> Dict[str, Any]:
    pid = os.getpid()
    return {"what": "the temporary output of an unfinished soarpack run", "target": target.name, "pid": pid,
            "host": socket.gethostname(), "boot_id": _boot_id(), "process_start": _process_start(pid),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def read_incomplete_marker(folder: str | os.PathLike) -> Optional[Dict[str, Any]]:
    """The owner record of an unfinished run's temp folder, or None when `folder` is not one."""
    path = Path(folder) / INCOMPLETE_MARKER
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    return data if isinstance(data, dict) else {"unreadable": True}


def lock_state(lock_path: str | os.PathLike) -> Optional[str]:
    """"self", "running" (a live process holds the lock), "gone" (nobody does), or None (no lock file)."""
    lock_path = str(lock_path)
    if lock_path in _HELD:
        return "self"
    fd = _take_dead_lock(lock_path)
    if fd is None:
        return None
    if fd == "busy":
        return "running"
    os.close(fd)  # only looked: the next run for its target cleans it up
    return "gone"


def owner_state(owner: Dict[str, Any]) -> str:
    """For a temp folder without a lock file (made before locks): "self", "running", "gone", or "unknown"
    (another host, or an unreadable marker). Host, pid and boot id only; `temp_owner` prefers the lock."""
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return "unknown"
    boot = _boot_id()
    if boot and owner.get("boot_id") and owner["boot_id"] != boot:
        return "gone"  # the machine rebooted since
    pid = owner["pid"]
    recorded, now = owner.get("process_start"), _process_start(pid)
    if recorded is not None and now is not None and recorded != now:
        return "gone"  # the pid was reused by another process
    if pid == os.getpid():
        return "self"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone"
    except PermissionError:
        pass
    return "running"


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
        return {**(marker or {}), **_read_record(f"{base}.lock")}, state
    if marker is not None:
        return marker, owner_state(marker)
    return None


def _temp_groups(target: Path) -> Dict[str, set]:
    """`.TARGET.tmp-ID` -> the suffixes present ("" the temp itself, ".lock", ".journal", ...)."""
    parent = target.parent if str(target.parent) else Path(".")
    prefix = f".{target.name}.tmp-"
    groups: Dict[str, set] = {}
    try:
        names = os.listdir(parent)
    except OSError:
        return {}
    for name in names:
        if not name.startswith(prefix):
            continue
        ident, dot, rest = name[len(prefix):].partition(".")
        groups.setdefault(str(parent / f"{prefix}{ident}"), set()).add(dot + rest)
    return groups


def _dead_run_line(base: str, target: Path, record: Dict[str, Any]) -> str:
    """What the temp of a dead run was, from the inodes its lock file recorded before the placement."""
    who = f"a run (pid {record.get('pid', '?')}, started {record.get('started', '?')}) that was killed"
    if record.get("state") == "placing" and record.get("new") and _ino(target) == record["new"]:
        was = "the old one it had replaced" if record.get("old") else "a second name of it"
        return f"removed {base}: {target} is the new output of {who} after placing it; this was {was}"
    if record.get("old") and _ino(target) == record["old"]:
        return f"removed {base}: the unfinished output of {who}; {target} is the old output, untouched"
    return f"removed {base}: the unfinished output of {who}" + ("" if os.path.lexists(target) else f"; {target} was never written")


def remove_stale_temps(target: str | os.PathLike, log: Callable[[str], None]) -> list[Path]:
    """Clean up after killed runs writing `target`: finish their journals (saying which way) and remove their temp
    outputs; return what was removed. A temp whose lock a live process holds (any PID namespace) is kept."""
    target = Path(target)
    removed = []
    _remove_stale_probes(target)
    _restore_legacy_aside(target, log)
    for base, suffixes in sorted(_temp_groups(target).items()):
        lock = f"{base}.lock"
        if ".lock" in suffixes:
            fd = _take_dead_lock(lock)
            if fd == "busy":
                if lock not in _HELD:
                    record = _read_record(lock)
                    _say_once(log, f"{base} belongs to a running soarpack run (pid {record.get('pid', '?')} on "
                                   f"{record.get('host', '?')}); left alone")
                continue
            if fd is None:
                continue
            try:
                _clean_dead_run(base, suffixes, target, lock, log, removed)
            except OSError as exc:
                _say_once(log, f"could not clean up {base} ({exc.strerror or exc}); left alone")
            finally:
                os.close(fd)
        elif "" in suffixes:
            _legacy_temp(Path(base), target, log, removed)
    return removed


def _restore_legacy_aside(target: Path, log: Callable[[str], None]) -> None:
    """Before placements were exchanges, a run killed between its two renames left no TARGET and the old output in
    `.TARGET.old-PID`, forever. With TARGET missing, putting it back loses nothing."""
    parent = target.parent if str(target.parent) else Path(".")
    for aside in sorted(parent.glob(f".{target.name}.old-*")):
        if not aside.name.rsplit("-", 1)[1].isdigit() or aside.is_symlink():
            continue
        if os.path.lexists(target):
            _say_once(log, f"{aside} is an old output that an earlier soarpack set aside while replacing {target}; "
                           f"left alone (delete it by hand once {target} is right)")
            continue
        with contextlib.suppress(OSError):
            os.rename(aside, target)
            log(f"restored {target} from {aside}: the old output of a run that was killed while replacing it")


def _remove_stale_probes(target: Path) -> None:
    """Writability probes (`.TARGET.probe-*`) are empty and live for two calls; one left behind was killed."""
    parent = target.parent if str(target.parent) else Path(".")
    for probe in parent.glob(f".{target.name}.probe-*"):
        with contextlib.suppress(OSError):
            if probe.is_dir() and not probe.is_symlink():
                probe.rmdir()  # only when empty
            elif probe.is_file() and probe.stat().st_size == 0:
                probe.unlink()


def _clean_dead_run(base: str, suffixes: set, target: Path, lock: str, log: Callable[[str], None],
                    removed: list) -> None:
    record = _read_record(lock)
    if ".journal" in suffixes:
        log(f"{_recover_journal(base + '.journal')} (a run, pid {record.get('pid', '?')}, was killed "
            "while replacing it)")
    if "" in suffixes and os.path.lexists(base):
        line = _dead_run_line(base, target, record)
        _discard(base)
        log(line)
        removed.append(Path(base))
    for suffix in suffixes - {"", ".lock", ".journal"}:
        _discard(base + suffix)
    os.unlink(lock)


def _legacy_temp(tmp: Path, target: Path, log: Callable[[str], None], removed: list) -> None:
    """A temp without a lock file: from a soarpack before locks (marker only), or not ours."""
    if not tmp.is_dir() or tmp.is_symlink():
        return
    owner = read_incomplete_marker(tmp)
    if owner is None:
        _say_once(log, f"{tmp} has no owner marker and no lock; left alone (delete it by hand if no soarpack run "
                       f"writes {target})")
        return
    state = owner_state(owner)
    if state == "gone":
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"removed {tmp}: the unfinished output of a run (pid {owner.get('pid')}, started {owner.get('started')}) "
            "that was killed")
        removed.append(tmp)
    elif state != "self":
        _say_once(log, f"{tmp} belongs to a run on host {owner.get('host')} (pid {owner.get('pid')}); left alone")


def note_line(msg: str) -> None:
    """The default `log` of cleanup: one `note:` line on stderr."""
    print(f"note: {msg}", file=sys.stderr, flush=True)


_stderr_line = note_line


def check_output_dir(target: str | os.PathLike, force: bool) -> Path:
    """Refuse a non-empty output directory unless force is set; return the resolved target."""
    target = Path(target)
    if target.exists():
        if not target.is_dir():
            raise OutputExistsError(f"output {target} exists and is not a directory", "choose another path")
        if any(target.iterdir()) and not force:
            raise OutputExistsError(f"output directory {target} is not empty", "pass --force to replace it")
    return target


def prepare_output_dir(target: str | os.PathLike, force: bool = False, *, inputs: Iterable[str | os.PathLike] = (),
                       what: str = "output", log: Callable[[str], None] = _stderr_line) -> Path:
    """Everything that can be known about an output folder before any work: it may be replaced (empty, or --force),
    it overlaps no input, its parent is writable. Killed runs' temps are cleaned up (journals finished) first."""
    target = Path(target)
    parent = target.parent if str(target.parent) else Path(".")
    if parent.is_dir():
        remove_stale_temps(target, log)
    target = check_output_dir(target, force)
    refuse_overlap(target, inputs, what=what)
    _probe_writable_folder(parent, target, what)
    return target


def _placement_error(target: Path, exc: OSError) -> SoarpackError:
    return SoarpackError(f"cannot write {target}: {exc.strerror or exc}; nothing was replaced",
                         "choose a writable location and run again")


@contextlib.contextmanager
def placing(target: str | os.PathLike, *, kind: str = "file", force: bool = False,
            inputs: Iterable[str | os.PathLike] = (), what: str = "output", marker: bool = False,
            log: Callable[[str], None] = _stderr_line) -> Iterator[Staging]:
    """Stage an output beside `target` (`.path`, a file or a folder), and `place` it when the block ends without
    error; `.placed` then says how (created, replaced, up to date). On an error the temp goes and `target` keeps
    what it held. `marker` puts INCOMPLETE_MARKER in a folder until it is placed."""
    target = Path(target)
    inputs = list(inputs)
    refuse_overlap(target, inputs, what=what)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target, log)
    st = Staging(target, kind)
    try:
        if marker:
            (st.path / INCOMPLETE_MARKER).write_text(json.dumps(_owner_record(target)) + "\n", encoding="utf-8")
        yield st
        if marker:
            (st.path / INCOMPLETE_MARKER).unlink()
        publish_permissions(st.path)
        try:
            st.placed = place(st, force=force, inputs=inputs, what=what)
        except OSError as exc:  # the final rename refused (a read-only remount, an immutable target, ...)
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EBUSY):
                raise _placement_error(target, exc) from exc
            raise
    except BaseException as exc:
        if is_disk_full(exc):
            raise _disk_full_error(target, exc) from exc
        raise
    finally:
        st.release()


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, *, force: bool = True, inputs: Iterable[str | os.PathLike] = (),
                what: str = "output") -> Iterator[Path]:
    """Yield a temporary path beside `target`; when the block ends without error it is placed (see `placing`):
    by default an existing target is replaced (`force`). A full disk becomes one line."""
    with placing(target, kind="file", force=force, inputs=inputs, what=what) as st:
        yield st.path


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, force: bool = False, *, inputs: Iterable[str | os.PathLike] = (),
               log: Callable[[str], None] = _stderr_line) -> Iterator[Path]:
    """Yield a temporary directory beside `target`; on success it replaces `target` with no moment between.

    `inputs` are refused as targets, as anything inside them and as anything containing them. The temp folder holds
    an owner marker (INCOMPLETE_MARKER) until it is placed, so a killed run's folder is known for what it is."""
    target = prepare_output_dir(target, force, inputs=inputs, log=log)
    with placing(target, kind="dir", force=force, inputs=inputs, marker=True, log=log) as st:
        yield st.path


def place_bytes(path: str | os.PathLike, data: bytes, *, force: bool = True,
                inputs: Iterable[str | os.PathLike] = (), what: str = "output") -> Placed:
    """Write `data` to `path` through `placing`: the same bytes already there are up to date, other bytes need
    `force` (the default: internal and result files are replaced; a user's output passes the user's --force)."""
    with placing(path, kind="file", force=force, inputs=inputs, what=what) as st:
        with open(st.path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    return st.placed


def atomic_write_bytes(path: str | os.PathLike, data: bytes, **kw: Any) -> Path:
    return place_bytes(path, data, **kw).path


def atomic_write_text(path: str | os.PathLike, text: str, **kw: Any) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), **kw)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2, **kw: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n", **kw)
