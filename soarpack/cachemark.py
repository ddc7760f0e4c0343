"""Which folders under soarpack's cache soarpack made: a marker file written inside each entry when soarpack
creates it (the image stand-in, the wheel cache, the gpu-serve extras).

`soarpack cache clear` deletes only entries that hold this marker: the cache root may be a folder shared with other
things ($SOARPACK_CACHE pointed at a home or a shared folder), and a folder of the right name is not proof that
soarpack made it. A folder that existed before soarpack used it is never marked, so it is never cleared.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Optional

MARKER = ".soarpack-cache-entry.json"
MADE_BY = "soarpack"
MAX_MARKER_BYTES = 4096


def mark(folder: Path, entry: str) -> None:
    """Write the marker into `folder`, which soarpack has just created as the cache entry `entry` ("wheels",
    "image-stack/KEY")."""
    from soarpack.version import __version__

    path = Path(folder) / MARKER
    tmp = path.with_name(f"{MARKER}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"made_by": MADE_BY, "entry": entry, "soarpack_version": __version__}) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)


def create_marked(folder: Path, entry: str) -> bool:
    """Create `folder` (its parents as needed) and mark it, if it does not exist yet; True when this call made it.
    An existing folder is left unmarked: soarpack did not make it (or an older soarpack did, without a marker)."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir()
    except FileExistsError:
        return False
    mark(folder, entry)
    return True


def marked_entry(folder: Path) -> Optional[str]:
    """The entry name the marker inside `folder` records, or None when `folder` is not a real folder (a link
    counts as none) or holds no valid marker."""
    folder = Path(folder)
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return None
        fd = os.open(folder / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = os.read(fd, MAX_MARKER_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        data = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_MARKER_BYTES else None
    except (ValueError, RecursionError):
        return None
    if isinstance(data, dict) and data.get("made_by") == MADE_BY and isinstance(data.get("entry"), str):
        return data["entry"]
    return None
