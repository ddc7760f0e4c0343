"""The one way an output reaches its final name.

Every writer stages its output beside the target (`.TARGET.tmp-ID`, a file or a folder, a `Staging`) and hands it
to `place`, which refuses an input or an existing output (unless forced) at that very moment, says "up to date" for
the same bytes, and swaps without a moment where TARGET is missing or half there:
  - a new file arrives by link() (or RENAME_NOREPLACE), so two writers to one name cannot both create it;
  - a file replaces a file in one rename(2);
  - a folder replaces a folder by renameat2(RENAME_EXCHANGE); where the filesystem lacks it, by two renames under
    a journal (`.TARGET.tmp-ID.journal`) that the next run rolls back or forward.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from soarpack.errors import OutputExistsError, SoarpackError
from soarpack.placement import rename
from soarpack.placement.checks import refuse_overlap
from soarpack.placement.content import discard, ino, same_content
from soarpack.placement.journal import journaled_swaps
from soarpack.placement.locks import folder_lock, new_lock, release_lock
from soarpack.placement.owner import owner_record, write_record


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
    """A temporary file or folder beside `target`, owned through its lock file; see `write.placing`."""

    def __init__(self, target: Path, kind: str):
        if kind not in ("file", "dir"):
            raise ValueError(kind)
        self.target, self.kind = target, kind
        self.lock_path, self.lock_fd = new_lock(target)
        self.path = Path(self.lock_path[: -len(".lock")])
        self.placed: Optional[Placed] = None
        try:
            if kind == "dir":
                os.mkdir(self.path, 0o700)
            else:
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except BaseException:
            release_lock(self.lock_path)
            raise

    def note(self, **fields: Any) -> None:
        """Record how far the placement went, in the lock file: what the next run reads if this one dies."""
        write_record(self.lock_fd, {**owner_record(self.target), **fields})

    def release(self) -> None:
        discard(self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.journal_path)
        release_lock(self.lock_path)

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
                discard(st.path)
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
    st.note(state="placing", new=ino(src), old=None)
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
        rename.renameat2(src, dst, rename.RENAME_NOREPLACE)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in rename.UNSUPPORTED:
            raise
    with folder_lock(st.target.parent):  # no hard links and no renameat2 (rare): check and rename, serialized
        if os.path.lexists(dst):
            return False
        os.rename(src, dst)
    return True


def _replace(st: Staging) -> None:
    src, dst = str(st.path), str(st.target)
    st.note(state="placing", new=ino(src), old=ino(dst))
    if st.kind == "file":
        os.replace(src, dst)  # one rename: the target is the old file or the new one, never neither
        return
    try:
        rename.renameat2(src, dst, rename.RENAME_EXCHANGE)
    except OSError as exc:
        if exc.errno not in rename.UNSUPPORTED:
            raise
        with folder_lock(st.target.parent):
            journaled_swaps(st.journal_path, [(dst, src, f"{src}.old")], kind="dir")
        return
    discard(src)  # the old output, now under the temp's name
