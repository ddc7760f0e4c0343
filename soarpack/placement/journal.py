"""Several renames that must look like one: a journal (`.TARGET.tmp-ID.journal`) names every swap before the first,
so an error rolls back at once and a kill is rolled back (or forward, once committed) by the next run."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Dict, List, Optional

from soarpack.placement.checks import disk_full_error, is_disk_full
from soarpack.placement.content import discard
from soarpack.placement.locks import new_lock, release_lock
from soarpack.placement.owner import read_record


def _write_journal(path: str, journal: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(journal) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def journaled_swaps(journal_path: str, swaps: List[tuple], *, kind: str) -> None:
    """Replace each target by its staged new version, all or nothing: (target, staged, aside) per swap.

    Files keep their old version by a hard link at `aside` and are then replaced in one rename each; a folder is
    renamed to `aside`, then the staged folder to its name. The journal says which step was reached, so an error
    here, or the next run after a kill (`recover_journal`), puts every old version back, or, once committed,
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
        discard(a)
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
            discard(a)
        elif os.path.lexists(a):
            if replaced:
                os.rename(t, s)
            os.rename(a, t)
        discard(s)


def recover_journal(path: str) -> str:
    """Finish a dead run's journal: back to the old versions, or forward when it had committed (or, for a folder,
    when the new one is in place and only the old one's removal was left). Returns what happened, for the log."""
    journal = read_record(path)
    swaps = journal.get("swaps") or []
    targets = ", ".join(s["target"] for s in swaps) or "?"
    forward = journal.get("state") == "committed" or (
        journal.get("kind") == "dir" and swaps and all(not os.path.lexists(s["staged"]) and os.path.lexists(s["target"])
                                                      for s in swaps))
    if not swaps or journal.get("state") not in ("replacing", "committed", "staging"):
        result = f"an unreadable journal {path}; nothing was moved"
    elif forward:
        for s in swaps:
            discard(s["aside"])
            discard(s["staged"])
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
    lock_path, _ = new_lock(anchor)
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
        journaled_swaps(journal_path, swaps, kind="file")
    except BaseException as exc:
        for _, s, _ in swaps:
            discard(s)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(journal_path)
        release_lock(lock_path)
        if is_disk_full(exc):
            raise disk_full_error(anchor, exc) from exc
        raise
    release_lock(lock_path)
