"""What is refused before any work, and the one-line errors of a write that failed: an output that is an input,
an unwritable or missing folder, a non-empty output folder without --force, a full disk."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import Iterable

from soarpack.errors import OutputExistsError, SoarpackError


def is_disk_full(exc: BaseException) -> bool:
    """An OSError ENOSPC, or a library's wrapper of one (safetensors reports it as text with "os error 28")."""
    if isinstance(exc, OSError):
        return exc.errno == errno.ENOSPC
    if isinstance(exc, SoarpackError):
        return False
    text = str(exc)
    return "os error 28" in text or "No space left on device" in text


def disk_full_error(target: Path, exc: OSError) -> SoarpackError:
    return SoarpackError(f"no space left on the device while writing {target}", "free disk space and run again; nothing was replaced")


def placement_error(target: Path, exc: OSError) -> SoarpackError:
    return SoarpackError(f"cannot write {target}: {exc.strerror or exc}; nothing was replaced",
                         "choose a writable location and run again")


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


def probe_writable_folder(folder: Path, target: Path, what: str) -> None:
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


def check_output_dir(target: str | os.PathLike, force: bool) -> Path:
    """Refuse a non-empty output directory unless force is set; return the resolved target."""
    target = Path(target)
    if target.exists():
        if not target.is_dir():
            raise OutputExistsError(f"output {target} exists and is not a directory", "choose another path")
        if any(target.iterdir()) and not force:
            raise OutputExistsError(f"output directory {target} is not empty", "pass --force to replace it")
    return target
