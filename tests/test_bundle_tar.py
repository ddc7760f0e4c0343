"""Deterministic packing and safe extraction of bundle tarballs."""

from __future__ import annotations

import gzip
import os
import tarfile
import time
from pathlib import Path

import pytest

from soarpack.bundle.tarpack import FIXED_MTIME, UnsafeArchiveError, pack_tree, safe_extract
from tar_helpers import write_tar


def _tree(root: Path, mtime: float) -> Path:
    (root / "b" / "deep").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\n")
    (root / "b" / "z.bin").write_bytes(bytes(range(256)) * 10)
    (root / "b" / "deep" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(root / "b" / "deep" / "run.sh", 0o750)
    os.symlink("../a.txt", root / "b" / "link")
    for p in [*root.rglob("*"), root]:
        os.utime(p, (mtime, mtime), follow_symlinks=False)
    return root


def test_same_tree_gives_identical_bytes_whatever_the_mtimes_and_names(tmp_path):
    one = pack_tree(_tree(tmp_path / "one", time.time()), tmp_path / "one.tar.gz")
    two = pack_tree(_tree(tmp_path / "two", 1_000_000), tmp_path / "two.tar.gz")
    assert one.read_bytes() == two.read_bytes()
    raw = one.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip header mtime
    assert b"one" not in gzip.decompress(raw)[:512]  # no temp or folder name leaks in


def test_members_are_sorted_owned_by_root_and_dated_fixed(tmp_path):
    out = pack_tree(_tree(tmp_path / "t", time.time()), tmp_path / "t.tar.gz")
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert names == ["a.txt", "b", "b/deep", "b/deep/run.sh", "b/link", "b/z.bin"]
    for m in members:
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", FIXED_MTIME)
    by_name = {m.name: m for m in members}
    assert by_name["b/deep/run.sh"].mode == 0o755 and by_name["a.txt"].mode == 0o644
    assert by_name["b/link"].issym() and by_name["b/link"].linkname == "../a.txt"


def test_content_change_changes_the_bytes(tmp_path):
    root = _tree(tmp_path / "t", 0)
    first = pack_tree(root, tmp_path / "1.tar.gz").read_bytes()
    (root / "a.txt").write_text("alpha!\n")
    assert pack_tree(root, tmp_path / "2.tar.gz").read_bytes() != first


def test_roundtrip_extracts_files_and_inner_links(tmp_path):
    out = pack_tree(_tree(tmp_path / "t", 0), tmp_path / "t.tar.gz")
    dest = safe_extract(out, tmp_path / "x")
    assert (dest / "b" / "z.bin").read_bytes() == bytes(range(256)) * 10
    assert (dest / "b" / "link").is_symlink() and (dest / "b" / "link").read_text() == "alpha\n"
    assert os.access(dest / "b" / "deep" / "run.sh", os.X_OK)


def _evil_tar(path: Path, member: tarfile.TarInfo, data: bytes = b"x") -> Path:
    return write_tar(path, [(tarfile.TarInfo("fine.txt"), b"ok"), (member, data)])


def _sym(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


def _hard(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, target
    return info


def _dev(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    return info


@pytest.mark.parametrize("member, why", [
    (tarfile.TarInfo("/etc/soarpack-evil"), "absolute"),
    (tarfile.TarInfo("../escape.txt"), "'..'"),
    (tarfile.TarInfo("a/../../escape.txt"), "'..'"),
    (_sym("abs-link", "/etc/passwd"), "absolute"),
    (_sym("sub/up-link", "../../outside"), "out of the tree"),
    (_hard("hard-link", "../outside"), "out of the tree"),
    (_dev("dev/null-ish"), "device"),
])
def test_unsafe_members_are_refused_before_anything_is_written(tmp_path, member, why):
    tar = _evil_tar(tmp_path / "evil.tar.gz", member)
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeArchiveError, match=why) as exc:
        safe_extract(tar, dest)
    assert member.name in str(exc.value)
    assert not (dest / "fine.txt").exists()
    assert not (tmp_path / "escape.txt").exists()


def test_symlink_then_file_through_it_is_refused(tmp_path):
    # A symlink to a folder inside the tree is legal; a later member written through a link that points out is not.
    outside = tmp_path / "outside"
    outside.mkdir()
    path = write_tar(tmp_path / "evil.tar.gz", [(_sym("d", "."), b""), (tarfile.TarInfo("d/ok.txt"), b"1")])
    safe_extract(path, tmp_path / "x")  # d -> . stays inside
    assert (tmp_path / "x" / "ok.txt").read_bytes() == b"1"


def test_not_a_tarball_is_a_plain_error(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not a tarball")
    with pytest.raises(Exception, match="cannot read"):
        safe_extract(bad, tmp_path / "x")
