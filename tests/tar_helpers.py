"""Hand-made tarballs for the extraction tests: any member, any type, in the order given."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path


def write_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    """A .tar.gz of `members` (a regular file gets its bytes and their size; other types are headers only)."""
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if info.isreg():
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info)
    return path
