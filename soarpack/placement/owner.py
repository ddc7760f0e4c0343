"""Who a temporary output belongs to: the record its lock file (and a temp folder's marker) holds, and whether that
process still lives.

A run killed with SIGKILL (or a power cut) cannot clean up: its `.OUT.tmp-ID` may hold a complete-looking
checkpoint. Its lock file says whether the owner still lives (soarpack.placement.locks); the marker inside a folder
says what it is, so `verify` of a copied temp folder still says it is not a result.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Dict, Optional

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


def owner_record(target: Path) -> Dict[str, Any]:
    """This process as the owner of a temp output for `target`."""
    pid = os.getpid()
    return {"what": "the temporary output of an unfinished soarpack run", "target": target.name, "pid": pid,
            "host": socket.gethostname(), "boot_id": _boot_id(), "process_start": _process_start(pid),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def write_record(fd: int, record: Dict[str, Any]) -> None:
    """Replace the JSON record of an open (lock) file."""
    data = (json.dumps(record) + "\n").encode("utf-8")
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def read_record(path: str | os.PathLike) -> Dict[str, Any]:
    """The JSON record of a lock file or journal; {} when it is missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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
    """For a temp folder without a lock file (made before locks): "self", "running", "gone", or "unknown"
    (another host, or an unreadable marker). Host, pid and boot id only; `locks.temp_owner` prefers the lock."""
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
