"""After killed runs: finish their journals (saying which way) and remove their temp outputs, keeping every temp
whose lock a live process holds. What is done is said to a `log`; none is silent."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List

from soarpack.placement.content import discard, ino
from soarpack.placement.journal import recover_journal
from soarpack.placement.locks import HELD, take_dead_lock
from soarpack.placement.owner import owner_state, read_incomplete_marker, read_record

Log = Callable[[str], None]
_SAID: set = set()  # cleanup lines already said by this process: each is said once, not once per phase


def silent(message: str) -> None:
    """The default `log`: says nothing (the CLI passes its sink's note)."""


def _say_once(log: Log, message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        log(message)


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
    if record.get("state") == "placing" and record.get("new") and ino(target) == record["new"]:
        was = "the old one it had replaced" if record.get("old") else "a second name of it"
        return f"removed {base}: {target} is the new output of {who} after placing it; this was {was}"
    if record.get("old") and ino(target) == record["old"]:
        return f"removed {base}: the unfinished output of {who}; {target} is the old output, untouched"
    return f"removed {base}: the unfinished output of {who}" + ("" if os.path.lexists(target) else f"; {target} was never written")


def remove_stale_temps(target: str | os.PathLike, log: Log = silent) -> List[Path]:
    """Clean up after killed runs writing `target`: finish their journals (saying which way) and remove their temp
    outputs; return what was removed. A temp whose lock a live process holds (any PID namespace) is kept."""
    target = Path(target)
    removed: List[Path] = []
    _remove_stale_probes(target)
    _restore_legacy_aside(target, log)
    for base, suffixes in sorted(_temp_groups(target).items()):
        lock = f"{base}.lock"
        if ".lock" in suffixes:
            fd = take_dead_lock(lock)
            if fd == "busy":
                if lock not in HELD:
                    record = read_record(lock)
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


def _restore_legacy_aside(target: Path, log: Log) -> None:
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


def _clean_dead_run(base: str, suffixes: set, target: Path, lock: str, log: Log, removed: list) -> None:
    record = read_record(lock)
    if ".journal" in suffixes:
        log(f"{recover_journal(base + '.journal')} (a run, pid {record.get('pid', '?')}, was killed "
            "while replacing it)")
    if "" in suffixes and os.path.lexists(base):
        line = _dead_run_line(base, target, record)
        discard(base)
        log(line)
        removed.append(Path(base))
    for suffix in suffixes - {"", ".lock", ".journal"}:
        discard(base + suffix)
    os.unlink(lock)


def _legacy_temp(tmp: Path, target: Path, log: Log, removed: list) -> None:
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
