"""The writers' entry points: check an output folder before any work, stage an output and place it (a folder, a
file, bytes, text, JSON). Each cleans up after killed runs writing the same target first, saying so to `log`."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from soarpack.placement.checks import (check_output_dir, disk_full_error, is_disk_full, placement_error,
                                       probe_writable_folder, refuse_overlap)
from soarpack.placement.cleanup import Log, remove_stale_temps, silent
from soarpack.placement.content import publish_permissions
from soarpack.placement.owner import INCOMPLETE_MARKER, owner_record
from soarpack.placement.place import Placed, Staging, place


def prepare_output_dir(target: str | os.PathLike, force: bool = False, *, inputs: Iterable[str | os.PathLike] = (),
                       what: str = "output", log: Log = silent) -> Path:
    """Everything that can be known about an output folder before any work: it may be replaced (empty, or --force),
    it overlaps no input, its parent is writable. Killed runs' temps are cleaned up (journals finished) first."""
    target = Path(target)
    parent = target.parent if str(target.parent) else Path(".")
    if parent.is_dir():
        remove_stale_temps(target, log)
    target = check_output_dir(target, force)
    refuse_overlap(target, inputs, what=what)
    probe_writable_folder(parent, target, what)
    return target


@contextlib.contextmanager
def placing(target: str | os.PathLike, *, kind: str = "file", force: bool = False,
            inputs: Iterable[str | os.PathLike] = (), what: str = "output", marker: bool = False,
            log: Log = silent) -> Iterator[Staging]:
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
            (st.path / INCOMPLETE_MARKER).write_text(json.dumps(owner_record(target)) + "\n", encoding="utf-8")
        yield st
        if marker:
            (st.path / INCOMPLETE_MARKER).unlink()
        publish_permissions(st.path)
        try:
            st.placed = place(st, force=force, inputs=inputs, what=what)
        except OSError as exc:  # the final rename refused (a read-only remount, an immutable target, ...)
            if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EBUSY):
                raise placement_error(target, exc) from exc
            raise
    except BaseException as exc:
        if is_disk_full(exc):
            raise disk_full_error(target, exc) from exc
        raise
    finally:
        st.release()


@contextlib.contextmanager
def atomic_file(target: str | os.PathLike, *, force: bool = True, inputs: Iterable[str | os.PathLike] = (),
                what: str = "output", log: Log = silent) -> Iterator[Path]:
    """Yield a temporary path beside `target`; when the block ends without error it is placed (see `placing`):
    by default an existing target is replaced (`force`). A full disk becomes one line."""
    with placing(target, kind="file", force=force, inputs=inputs, what=what, log=log) as st:
        yield st.path


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, force: bool = False, *, inputs: Iterable[str | os.PathLike] = (),
               log: Log = silent) -> Iterator[Path]:
    """Yield a temporary directory beside `target`; on success it replaces `target` with no moment between.

    `inputs` are refused as targets, as anything inside them and as anything containing them. The temp folder holds
    an owner marker (INCOMPLETE_MARKER) until it is placed, so a killed run's folder is known for what it is."""
    target = prepare_output_dir(target, force, inputs=inputs, log=log)
    with placing(target, kind="dir", force=force, inputs=inputs, marker=True, log=log) as st:
        yield st.path


def place_bytes(path: str | os.PathLike, data: bytes, *, force: bool = True,
                inputs: Iterable[str | os.PathLike] = (), what: str = "output", log: Log = silent) -> Placed:
    """Write `data` to `path` through `placing`: the same bytes already there are up to date, other bytes need
    `force` (the default: internal and result files are replaced; a user's output passes the user's --force)."""
    with placing(path, kind="file", force=force, inputs=inputs, what=what, log=log) as st:
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
