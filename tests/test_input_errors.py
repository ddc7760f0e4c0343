"""Issue 24, tracebacks become one line: archives judged by their bytes, a read-only HOME or --keep folder, a
malformed MANIFEST.

Read-only-ness is injected at the seam (os.mkdir and os.open under one folder fail with EROFS, as on a read-only
mount): tests may run as root, where chmod stops nothing, and need no mount privileges.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.bundle.build import build_bundle
from soarpack.bundle.summary import inspect_bundle
from soarpack.bundle.tarpack import safe_extract, write_tarball
from soarpack.cli import app
from soarpack.errors import SoarpackError


def run_cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def flat(result) -> str:
    return "".join(result.output.split())


def assert_one_error_line(result, *said: str, code: int = 2) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    for text in said:
        assert "".join(text.split()) in flat(result), (text, result.output)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "b.tar.gz"
    return build_bundle(out, wheels=False, calib_rows=8).path


def read_only_under(monkeypatch, folder: Path) -> Path:
    """Make `folder` behave as a read-only mount: creating anything under it fails with EROFS (an existing
    folder still answers EEXIST first, as Linux does)."""
    folder = Path(os.path.abspath(folder))
    real_mkdir, real_open = os.mkdir, os.open

    def inside(path) -> bool:
        try:
            return Path(os.path.abspath(os.fspath(path))).is_relative_to(folder)
        except TypeError:
            return False

    def mkdir(path, mode=0o777, *args, **kwargs):
        if inside(path) and not os.path.exists(path):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_mkdir(path, mode, *args, **kwargs)

    def open_(path, flags, mode=0o777, *args, **kwargs):
        if inside(path) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))
        return real_open(path, flags, mode, *args, **kwargs)

    real_path_mkdir = Path.mkdir

    def path_mkdir(self, mode=0o777, parents=False, exist_ok=False):
        # Python 3.10's pathlib calls an accessor bound to the original os.mkdir: refuse here too.
        if inside(self) and not self.exists():
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_path_mkdir(self, mode, parents, exist_ok)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(Path, "mkdir", path_mkdir)
    monkeypatch.setattr(os, "open", open_)
    return folder


# -- archives by their magic bytes ---------------------------------------------------------------------------


def _repack(bundle: Path, out: Path, mode: str) -> Path:
    """The bundle's members in another container (plain tar, xz, bzip2), under the name given."""
    with tarfile.open(bundle, "r:gz") as src, tarfile.open(out, mode) as dst:
        for member in src.getmembers():
            dst.addfile(member, src.extractfile(member) if member.isreg() else None)
    return out


@pytest.mark.parametrize("mode, kind", [("w", "uncompressed tar"), ("w:xz", "xz"), ("w:bz2", "bzip2")])
def test_a_tar_that_is_not_gzip_is_refused_whatever_its_name(bundle, tmp_path, mode, kind):
    fake = _repack(bundle, tmp_path / "b.tar.gz", mode)
    with pytest.raises(SoarpackError, match="not gzip") as exc:
        safe_extract(fake, tmp_path / "x")
    assert kind in exc.value.message and "tar xzf" in exc.value.message
    assert not (tmp_path / "x").exists()
    assert_one_error_line(run_cli("inspect", fake), "not gzip")
    # check refuses it as bad input too (issue 27 item 4), before any step: no verdict for what is no bundle
    check = run_cli("check", fake, "--no-rehearse")
    assert_one_error_line(check, "not gzip", kind, "tar xzf")
    assert "uploadable" not in check.output


def test_gzip_content_is_a_bundle_whatever_its_name(bundle, tmp_path):
    renamed = tmp_path / "upload.bin"
    shutil.copyfile(bundle, renamed)
    assert inspect_bundle(renamed)["profile"] == inspect_bundle(bundle)["profile"]
    safe_extract(renamed, tmp_path / "x")
    assert (tmp_path / "x" / "MANIFEST.json").is_file()


# -- read-only HOME and --keep -------------------------------------------------------------------------------


@pytest.fixture
def read_only_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("SOARPACK_CACHE", raising=False)
    return read_only_under(monkeypatch, home)


def test_build_with_wheels_under_a_read_only_home_is_one_error_line(read_only_home, tmp_path):
    result = run_cli("build", "-o", tmp_path / "out.tar.gz")
    assert_one_error_line(result, "wheel cache", "Read-only file system", "SOARPACK_CACHE")
    assert not (tmp_path / "out.tar.gz").exists()


def test_wheels_fetch_under_a_read_only_home_is_one_error_line(read_only_home):
    assert_one_error_line(run_cli("wheels", "fetch"), "wheel cache", "Read-only file system", "SOARPACK_CACHE")


def test_check_under_a_read_only_home_is_an_error_not_a_failed_bundle(bundle, read_only_home):
    result = run_cli("check", bundle)
    assert_one_error_line(result, "image stand-in", "Read-only file system", "SOARPACK_CACHE")
    assert "NOTuploadable" not in flat(result)  # the bundle is not at fault


@pytest.mark.parametrize("exists", [False, True], ids=["new-folder", "empty-folder"])
def test_check_keep_on_a_read_only_mount_is_one_error_line(bundle, tmp_path, monkeypatch, exists):
    mount = tmp_path / "ro"
    mount.mkdir()
    keep = mount / "keep"
    if exists:
        keep.mkdir()
    read_only_under(monkeypatch, mount)
    result = run_cli("check", bundle, "--no-rehearse", "--keep", keep)
    assert_one_error_line(result, "--keep", str(keep), "Read-only file system")


# -- a malformed MANIFEST ------------------------------------------------------------------------------------


def _with_manifest(bundle: Path, tmp_path: Path, change) -> Path:
    root = tmp_path / "tree"
    safe_extract(bundle, root)
    manifest = json.loads((root / "MANIFEST.json").read_text())
    (root / "MANIFEST.json").write_text(json.dumps(change(manifest)))
    return write_tarball(root, tmp_path / "edited.tar.gz")


MALFORMED = [
    (lambda m: {**m, "quantize": "w4"}, "quantize = 'w4': input should be a valid dictionary"),
    (lambda m: {**m, "profile": "safe"}, "profile = 'safe': input should be a valid dictionary"),
    (lambda m: {**m, "wheels": "none"}, "wheels = 'none': input should be a valid dictionary"),
    (lambda m: {**m, "sglang": []}, "sglang = []: input should be a valid dictionary"),
    (lambda m: {k: v for k, v in m.items() if k != "quantize"}, "quantize = missing: field required"),
    (lambda m: {**m, "quantize": {**m["quantize"], "calib": "calib/builtin.jsonl"}}, "quantize [calib] = 'calib/builtin.jsonl': input should be a valid list"),
    (lambda m: {**m, "profile": {**m["profile"], "args_string": 5}}, "profile [args_string] = 5: input should be a valid string"),
]


@pytest.mark.parametrize("change, said", MALFORMED)
def test_a_malformed_manifest_is_one_error_line(bundle, tmp_path, change, said):
    edited = _with_manifest(bundle, tmp_path, change)
    assert_one_error_line(run_cli("inspect", edited), "MANIFEST.json", said)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"task": "niah", "question": "q", "gold": ["x"]}) + "\n")
    result = run_cli("eval", "--api-base", "http://127.0.0.1:9", "--data", data, "--bundle", edited)
    assert_one_error_line(result, "MANIFEST.json", said)  # before any request (port 9 has no server)
    check = run_cli("check", edited, "--no-rehearse")
    assert check.exit_code == 1, check.output
    assert check.exception is None or isinstance(check.exception, SystemExit), repr(check.exception)
    assert "Traceback" not in check.output and "FAILstructure" in flat(check)
    assert "".join(said.split()) in flat(check)
