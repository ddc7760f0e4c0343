"""Deterministic .tar.gz packing and safe extraction.

Packing: sorted names, fixed mtime, uid/gid 0, empty owner names, gzip header mtime 0, so identical trees give
byte-identical tarballs. Extraction refuses absolute names, `..`, links that leave the tree (each resolved through
the archive's own symlinks, so chains of links are caught), hard links to nothing, duplicate names and device
files, whatever Python version runs it (tarfile's `filter=` only exists from 3.10.12); and caps the entry count and
the unpacked size (see MAX_ENTRIES, MAX_UNPACKED_BYTES, MAX_RATIO) before writing anything. An archive is judged by
its first bytes, not its name: only gzip content is read, as the platform's `tar xzf` reads only that.
"""

from __future__ import annotations

import copy
import errno
import gzip
import os
import stat
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from soarpack.errors import SoarpackError
from soarpack.placement.write import atomic_file

# 2020-01-01T00:00:00Z: a fixed, non-zero mtime (some tools treat 0 as "unknown").
FIXED_MTIME = 1577836800

# Caps on what a bundle may unpack to, checked from the headers before anything is written. A real bundle is about
# 135 MB packed in 139 files (wheels, already compressed, are most of it); one shipping an SGLang tree adds about
# 1,600 files and 17 MB. The platform caps the upload (soarpack.facts.limits); the unpacked tree is ours to cap:
MAX_ENTRIES = 20_000  # >10x the largest real bundle's file count
MAX_UNPACKED_BYTES = 8 * 2**30  # a full upload at 4x: source and JSONL compress about 5x, wheels about 1x
MAX_RATIO = 20  # unpacked bytes per tarball byte: 4x the most compressible real content (source text, ~5x) ...
MIN_UNPACKED_ALLOWANCE = 512 * 2**20  # ... but a small bundle may always unpack to this much
_MAX_LINK_HOPS = 40  # as the Linux kernel's limit on symlinks followed in one lookup


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


def write_tarball(root: str | os.PathLike, path: str | os.PathLike) -> Path:
    """Pack everything under root (names relative to root) into `path`, deterministically; not atomic by itself."""
    root, path = Path(root), Path(path)
    with open(path, "wb") as raw:
        # filename="" and mtime=0 keep the gzip header free of the temp name and the clock.
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
            # PAX keeps long names and is stable; GNU/USTAR would split long names differently.
            with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for member_path in iter_tree(root):
                    info = _tarinfo(member_path, member_path.relative_to(root).as_posix())
                    if info.isreg():
                        with open(member_path, "rb") as fh:
                            tar.addfile(info, fh)
                    else:
                        tar.addfile(info)
        raw.flush()
        os.fsync(raw.fileno())
    return path


def pack_tree(root: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Pack everything under root into out, deterministically and atomically."""
    with atomic_file(out) as tmp:
        write_tarball(root, tmp)
    return Path(out)


def _parts(name: str) -> list[str]:
    return [p for p in PurePosixPath(name).parts if p not in ("", ".")]


def _resolve(parts: list[str], links: dict[str, str]) -> list[str] | None:
    """Follow a path (relative to the root) through the archive's own symlinks, as the filesystem will once they
    are extracted; None when it leaves the root. Independent of tarfile's data filter (3.10.12+ only)."""
    out: list[str] = []
    todo = list(parts)
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(part)
        target = links.get("/".join(out))
        if target is not None:
            hops += 1
            if hops > _MAX_LINK_HOPS or target.startswith("/"):
                return None
            out.pop()
            todo = [p for p in PurePosixPath(target).parts if p not in ("", ".")] + todo
    return out


def member_problem(member: tarfile.TarInfo) -> str | None:
    """What is wrong with a member on its own (its name and type); links are checked against the whole archive."""
    name = member.name
    if not name or name.startswith("/") or PurePosixPath(name).is_absolute() or (len(name) > 1 and name[1] == ":"):
        return "has an absolute path"
    if ".." in PurePosixPath(name).parts:
        return "contains '..'"
    if member.issym() or member.islnk():
        if not member.linkname or member.linkname.startswith("/"):
            return f"is a link to an absolute path ({member.linkname})"
        return None
    if not (member.isreg() or member.isdir()):
        return "is a device, fifo or other special file"
    return None


def _link_problem(member: tarfile.TarInfo, links: dict[str, str], files_before: set[str]) -> str | None:
    name = _parts(member.name)
    if _resolve(name[:-1], links) is None:
        return "has a folder that resolves outside the tree through a symlink"
    if member.issym():
        if _resolve(name[:-1] + _parts(member.linkname), links) is None:
            return f"is a link out of the tree ({member.linkname})"
    elif member.islnk():
        if _resolve(_parts(member.linkname), links) is None:
            return f"is a link out of the tree ({member.linkname})"
        if "/".join(_parts(member.linkname)) not in files_before:
            return f"is a hard link to {member.linkname}, which is not a file earlier in the archive"
    return None


def check_members(members: list[tarfile.TarInfo]) -> list[tarfile.TarInfo]:
    """Refuse the archive if any member would land outside the extraction folder, however links are chained."""
    def refuse(member: tarfile.TarInfo, problem: str) -> UnsafeArchiveError:
        return UnsafeArchiveError(f"unsafe tarball member {member.name!r}: it {problem}", "rebuild the bundle with `soarpack build`")

    seen: set[str] = set()
    for member in members:
        problem = member_problem(member)
        if problem:
            raise refuse(member, problem)
        key = "/".join(_parts(member.name))
        if key in seen:
            raise refuse(member, "appears twice")  # a later copy could turn a checked folder into a link
        seen.add(key)
    # Every link is resolved against all the archive's symlinks: the tree they make once all are extracted.
    links = {"/".join(_parts(m.name)): m.linkname for m in members if m.issym()}
    files_before: set[str] = set()
    for member in members:
        problem = _link_problem(member, links, files_before)
        if problem:
            raise refuse(member, problem)
        if member.isreg():
            files_before.add("/".join(_parts(member.name)))
    return members


def unpacked_limit(tarball_bytes: int) -> int:
    """How many bytes a bundle of this size may unpack to (see MAX_UNPACKED_BYTES and MAX_RATIO)."""
    return min(MAX_UNPACKED_BYTES, max(MIN_UNPACKED_ALLOWANCE, MAX_RATIO * tarball_bytes))


def check_limits(members: list[tarfile.TarInfo], tarball_bytes: int, *, max_entries: int = MAX_ENTRIES,
                 max_bytes: int | None = None) -> None:
    """Refuse an archive with too many entries or too many unpacked bytes, from its headers, before writing."""
    if len(members) > max_entries:
        raise UnsafeArchiveError(f"the tarball holds {len(members):,} entries, over soarpack's cap of {max_entries:,}",
                                 "a soarpack bundle holds a few hundred files (a shipped SGLang tree about 1,600)")
    limit = unpacked_limit(tarball_bytes) if max_bytes is None else max_bytes
    total = sum(m.size for m in members if m.isreg())
    if total > limit:
        raise UnsafeArchiveError(f"the tarball unpacks to {total / 2**20:,.0f} MiB, over soarpack's cap of "
                                 f"{limit / 2**20:,.0f} MiB for a {tarball_bytes / 2**20:,.1f} MiB tarball",
                                 "a soarpack bundle unpacks to a few times its size; this one is a decompression bomb")


# What the first bytes of a file say it is; the name says nothing (the platform runs `tar xzf` on the upload).
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"), (b"\x28\xb5\x2f\xfd", "zstd"),
          (b"PK\x03\x04", "zip"))


def archive_format(head: bytes) -> str:
    """'gzip', 'xz', 'bzip2', 'zstd', 'zip', 'tar' (uncompressed), 'empty' or 'unknown', from a file's first
    512 bytes."""
    if not head:
        return "empty"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    return "tar" if head[257:262] == b"ustar" else "unknown"


def require_gzip(path: str | os.PathLike) -> None:
    """Refuse a file that `tar xzf` would refuse, whatever it is named: only gzip content is a bundle."""
    with open(path, "rb") as fh:
        kind = archive_format(fh.read(512))
    if kind != "gzip":
        what = {"empty": "an empty file", "unknown": "not an archive (no gzip header)",
                "tar": "an uncompressed tar"}.get(kind, f"a {kind}-compressed file")
        raise SoarpackError(f"cannot read {path} as a tarball: it is {what}, not gzip, and the platform extracts the "
                            "upload with `tar xzf`", "pass the .tar.gz that `soarpack build` wrote: gzip content, "
                            "whatever the file's name")


def _read_members(tar_path: Path) -> tuple[tarfile.TarFile, list[tarfile.TarInfo]]:
    try:
        require_gzip(tar_path)
        tar = tarfile.open(tar_path, "r:gz")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise SoarpackError(f"cannot read {tar_path} as a tarball: {exc}", "pass the .tar.gz that `soarpack build` wrote") from None
    try:
        return tar, tar.getmembers()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        tar.close()
        raise SoarpackError(f"{tar_path} is truncated or corrupt ({type(exc).__name__}: {exc or 'unexpected end of data'})",
                            "copy or download the bundle again, or rebuild it with `soarpack build`") from None


def safe_extract(tar_path: str | os.PathLike, dest: str | os.PathLike, *, max_entries: int = MAX_ENTRIES,
                 max_bytes: int | None = None) -> Path:
    """Extract tar_path into dest after refusing every unsafe member and checking the caps; nothing is written if
    one is found."""
    tar_path, dest = Path(tar_path), Path(dest)
    tar, members = _read_members(tar_path)
    with tar:
        check_members(members)
        check_limits(members, tar_path.stat().st_size, max_entries=max_entries, max_bytes=max_bytes)
        dest.mkdir(parents=True, exist_ok=True)
        root = dest.resolve()
        extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        try:
            for member in members:
                # Second line of defence: the real parent on disk, after the links extracted so far.
                parent = (root / member.name).parent.resolve()
                if os.path.commonpath([str(root), str(parent)]) != str(root):
                    raise UnsafeArchiveError(f"unsafe tarball member {member.name!r}: its folder resolves outside the tree",
                                             "rebuild the bundle with `soarpack build`")
                member = copy.copy(member)
                member.mode &= 0o755
                member.uid = member.gid = 0
                member.uname = member.gname = ""
                tar.extract(member, root, set_attrs=not member.issym(), numeric_owner=True, **extra)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise SoarpackError(f"no space left on the device while extracting {tar_path} into {dest}",
                                    "free disk space (or point TMPDIR at a larger disk) and run again") from None
            raise
        except (tarfile.TarError, EOFError, zlib.error) as exc:
            raise SoarpackError(f"{tar_path} is truncated or corrupt ({type(exc).__name__}: {exc})",
                                "copy or download the bundle again, or rebuild it with `soarpack build`") from None
    return dest
