"""Deterministic .tar.gz packing and safe extraction.

Packing: sorted names, fixed mtime, uid/gid 0, empty owner names, gzip header mtime 0, so identical trees give
byte-identical tarballs. Extraction refuses absolute names, `..`, links that leave the tree and device files,
whatever Python version runs it (tarfile's `filter=` only exists from 3.10.12).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import gzip
import os
import stat
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from soarpack.errors import SoarpackError

# 2020-01-01T00:00:00Z: a fixed, non-zero mtime (some tools treat 0 as "unknown").
FIXED_MTIME = 1577836800


class UnsafeArchiveError(SoarpackError):
    """A tarball member that would land outside the extraction folder or is not a plain file/dir/link."""


def iter_tree(root: Path) -> list[Path]:
    """All paths under root (dirs included), sorted by their POSIX relative name."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            out.append(Path(dirpath, name))
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _tarinfo(path: Path, arcname: str) -> tarfile.TarInfo:
    st = path.lstat()
    info = tarfile.TarInfo(arcname)
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
    elif stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        info.size = st.st_size
        info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
    else:
        raise SoarpackError(f"cannot pack {path}: not a file, folder or symlink", "remove it from the bundle tree")
    return info


def pack_tree(root: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Pack everything under root (names relative to root) into out, deterministically and atomically."""
    root, out = Path(root), Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            # filename="" and mtime=0 keep the gzip header free of the temp name and the clock.
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                # PAX keeps long names and is stable; GNU/USTAR would split long names differently.
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    for path in iter_tree(root):
                        info = _tarinfo(path, path.relative_to(root).as_posix())
                        if info.isreg():
                            with open(path, "rb") as fh:
                                tar.addfile(info, fh)
                        else:
                            tar.addfile(info)
            raw.flush()
            os.fsync(raw.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it 0600; a tarball is not a secret
        os.replace(tmp, out)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise SoarpackError(f"no space left on the device while writing {out}", "free disk space and build again") from exc
        raise
    return out


def _member_problem(member: tarfile.TarInfo) -> str | None:
    name = member.name
    if not name or name.startswith("/") or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        return "has an absolute path"
    parts = PurePosixPath(name).parts
    if ".." in parts:
        return "contains '..'"
    if member.issym() or member.islnk():
        target = member.linkname
        if not target or target.startswith("/"):
            return f"is a link to an absolute path ({target})"
        # Symlinks resolve against the member's folder, hard links against the archive root.
        base = PurePosixPath(name).parent if member.issym() else PurePosixPath(".")
        depth = 0
        for part in (base / target).parts:
            if part == "..":
                depth -= 1
                if depth < 0:
                    return f"is a link out of the tree ({target})"
            elif part not in (".", ""):
                depth += 1
        return None
    if not (member.isreg() or member.isdir()):
        return "is a device, fifo or other special file"
    return None


def check_members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    members = tar.getmembers()
    for member in members:
        problem = _member_problem(member)
        if problem:
            raise UnsafeArchiveError(f"unsafe tarball member {member.name!r}: it {problem}", "rebuild the bundle with `soarpack build`")
    return members


def safe_extract(tar_path: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Extract tar_path into dest after refusing every unsafe member; nothing is written if one is found."""
    tar_path, dest = Path(tar_path), Path(dest)
    try:
        tar = tarfile.open(tar_path, "r:*")
    except (tarfile.TarError, OSError) as exc:
        raise SoarpackError(f"cannot read {tar_path} as a tarball: {exc}", "pass the .tar.gz that `soarpack build` wrote") from exc
    with tar:
        members = check_members(tar)
        dest.mkdir(parents=True, exist_ok=True)
        root = dest.resolve()
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        for member in members:
            # A symlink extracted earlier could redirect a later member: check the real parent too.
            parent = (root / member.name).parent.resolve()
            if os.path.commonpath([str(root), str(parent)]) != str(root):
                raise UnsafeArchiveError(f"unsafe tarball member {member.name!r}: its folder resolves outside the tree", "rebuild the bundle with `soarpack build`")
            member = copy.copy(member)
            member.mode &= 0o755
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            tar.extract(member, root, set_attrs=not member.issym(), numeric_owner=True, **extra)
    return dest
