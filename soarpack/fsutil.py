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
import socket
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, Optional

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


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `target`; when the block ends without error it replaces `target` in one rename.

    On any exception the temporary file is removed and `target` keeps what it held; a full disk becomes one line.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644 & ~_umask())  # mkstemp made it 0600; results are not secrets
        os.replace(tmp, target)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if is_disk_full(exc):
            raise _disk_full_error(target, exc) from exc
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    return path


def replace_files(contents: Dict[Path, bytes]) -> None:
    """Replace several existing files all or nothing, each keeping its mode.

    Every new file is staged beside its target first; then each target is moved aside and its new file renamed
    in. If any step fails (a full disk, an immutable file), the targets moved so far are put back: no file is left
    half-written and the set is never half-replaced.
    """
    staged: list[tuple[Path, Path, Path]] = []  # (target, new file, where the old one goes)
    swapped: list[tuple[Path, Path, Path]] = []
    try:
        for target, data in contents.items():
            fd, new = tempfile.mkstemp(prefix=f".{target.name}.new-", dir=target.parent)
            staged.append((target, Path(new), target.with_name(f".{target.name}.old-{os.getpid()}")))
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(new, stat.S_IMODE(target.stat().st_mode))
        for target, new, old in staged:
            os.rename(target, old)
            swapped.append((target, new, old))
            os.rename(new, target)
    except BaseException as exc:
        for target, new, old in reversed(swapped):
            os.replace(old, target)
        for _, new, _ in staged:
            with contextlib.suppress(OSError):
                os.unlink(new)
        if is_disk_full(exc):
            raise _disk_full_error(next(iter(contents)).parent, exc) from exc
        raise
    for _, _, old in swapped:
        with contextlib.suppress(OSError):
            os.unlink(old)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def ensure_writable_output(target: str | os.PathLike, *, what: str = "output",
                           inputs: Iterable[str | os.PathLike] = (), make_parent: bool = False) -> Path:
    """Fail before any work when `target` cannot be written as a file: a folder, a missing (unless make_parent) or
    read-only parent, or one of `inputs` (see refuse_overlap).

    Probes with a real temporary file beside the target, so read-only mounts and permission bits are both caught.
    """
    target = Path(target)
    refuse_overlap(target, inputs, what=what)
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
        os.rmdir(tempfile.mkdtemp(prefix=f".{target.name}.probe-", dir=existing))
    except OSError as exc:
        raise SoarpackError(f"{what} {target} cannot be written: {exc.strerror or exc}",
                            "choose a writable location") from None


# -- temporary folders of unfinished runs ------------------------------------------------------------------------
# A run killed with SIGKILL (or a power cut) cannot clean up: its `.OUT.tmp-*` folder may hold a complete-looking
# checkpoint. The marker says whose it is, so the next run removes it only once its owner is gone, and `verify`
# can say that a folder is an unfinished temp folder rather than a result.

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
    return {"what": "the temporary folder of an unfinished soarpack run", "target": target.name, "pid": pid,
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


def owner_state(owner: Dict[str, Any]) -> str:
    """"self" (this process), "running", "gone", or "unknown" (another host, or an unreadable marker)."""
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


def remove_stale_temps(target: str | os.PathLike, log: Callable[[str], None]) -> list[Path]:
    """Remove the `.TARGET.tmp-*` folders of runs that were killed; return them. A live owner's folder is kept."""
    target = Path(target)
    parent = target.parent if str(target.parent) else Path(".")
    removed = []
    for tmp in sorted(parent.glob(f".{target.name}.tmp-*")):
        if not tmp.is_dir() or tmp.is_symlink():
            continue
        owner = read_incomplete_marker(tmp)
        if owner is None:
            log(f"note: {tmp} has no owner marker; left alone (delete it by hand if no soarpack run writes {target})")
            continue
        state = owner_state(owner)
        if state == "gone":
            shutil.rmtree(tmp, ignore_errors=True)
            log(f"removed {tmp}: the unfinished output of a run (pid {owner.get('pid')}, started {owner.get('started')}) "
                "that was killed")
            removed.append(tmp)
        elif state == "unknown":
            log(f"note: {tmp} belongs to a run on host {owner.get('host')}; left alone")
    return removed


def _stderr_line(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
    it overlaps no input, its parent is writable. Stale temp folders of killed runs are removed on the way."""
    target = check_output_dir(target, force)
    refuse_overlap(target, inputs, what=what)
    parent = target.parent if str(target.parent) else Path(".")
    _probe_writable_folder(parent, target, what)
    remove_stale_temps(target, log)
    return target


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, force: bool = False, *, inputs: Iterable[str | os.PathLike] = (),
               log: Callable[[str], None] = _stderr_line) -> Iterator[Path]:
    """Yield a temporary directory beside `target`; on success it replaces `target` in one rename.

    On any exception (KeyboardInterrupt included) the temporary directory is removed and `target` is left as it was.
    `inputs` are refused as targets, as anything inside them and as anything containing them. The temp folder holds
    an owner marker (INCOMPLETE_MARKER) until the rename, so a killed run's folder is known for what it is.
    """
    target = prepare_output_dir(target, force, inputs=inputs, log=log)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    marker = tmp / INCOMPLETE_MARKER
    try:
        marker.write_text(json.dumps(_owner_record(target)) + "\n", encoding="utf-8")
        yield tmp
        marker.unlink()
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc):
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
