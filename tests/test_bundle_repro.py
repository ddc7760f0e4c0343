"""One tarball hash identifies one submission: wheels built from sdists are byte-identical across caches."""

import hashlib
import os
import zipfile

import pytest

from soarpack.bundle import wheels as wh
from soarpack.bundle.build import build_bundle


def test_normalize_wheel_is_independent_of_timestamps_order_and_modes(tmp_path):
    def wheel(path, order, when, mode):
        with zipfile.ZipFile(path, "w") as zf:
            for name in order:
                info = zipfile.ZipInfo(name, date_time=when)
                info.external_attr = mode << 16
                zf.writestr(info, f"content of {name}")
        return path

    names = ["pkg/__init__.py", "pkg/_ext.so", "pkg-1.0.dist-info/METADATA", "pkg-1.0.dist-info/RECORD"]
    a = wheel(tmp_path / "a.whl", names, (2024, 5, 1, 12, 0, 0), 0o100664)
    b = wheel(tmp_path / "b.whl", list(reversed(names)), (2025, 1, 2, 3, 4, 6), 0o100600)
    na, nb = wh.normalize_wheel(a, tmp_path / "na.whl"), wh.normalize_wheel(b, tmp_path / "nb.whl")
    assert na.read_bytes() == nb.read_bytes()
    with zipfile.ZipFile(na) as zf:
        assert zf.namelist()[-1].endswith("RECORD") and zf.namelist()[0] == "pkg/__init__.py"
        record = zf.read("pkg-1.0.dist-info/RECORD").decode().splitlines()
        assert record[-1] == "pkg-1.0.dist-info/RECORD,,"
        assert record[0] == wh._record_line("pkg/__init__.py", b"content of pkg/__init__.py")


def test_find_python310_asks_uv(tmp_path, monkeypatch):
    """With no pyenv and no python3.10 on PATH, uv's own 3.10 is found (the hint suggests `uv python install`)."""
    py = os.path.realpath(wh.find_python310() or pytest.skip("no CPython 3.10 here"))
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "uv").write_text(f"#!/bin/sh\n[ \"$1 $2 $3\" = 'python find 3.10' ] && echo {py}\n")
    (fake_bin / "uv").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake_bin))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.delenv("SOARPACK_PYTHON310", raising=False)
    if wh.sys.version_info[:2] == (3, 10):
        monkeypatch.setattr(wh.sys, "version_info", (3, 11))
    assert wh.find_python310() == py


@pytest.mark.slow
def test_two_builds_with_separate_empty_caches_are_byte_identical(tmp_path):
    """Network to PyPI (~130 MB per cache) and a CPython 3.10 to compile pypcre."""
    digests = []
    for name in ("cache-a", "cache-b"):
        out = build_bundle(tmp_path / f"{name}.tar.gz", cache_dir=tmp_path / name, calib_rows=8, on_event=lambda e: print(e.message)).path
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert digests[0] == digests[1]


def test_missing_python310_hint_does_not_suggest_a_bundle_that_cannot_quantize(tmp_path, monkeypatch):
    monkeypatch.setattr(wh, "find_python310", lambda: None)
    monkeypatch.setattr(wh, "_pip", lambda *a, **k: pytest.fail("nothing may be fetched before the check"))
    with pytest.raises(wh.WheelError) as err:
        wh.fetch_into_cache([wh.LockedWheel("pypcre", "0.6.4", "sdist")], tmp_path)
    assert "--no-wheels" not in str(err.value) and "SOARPACK_PYTHON310" in err.value.hint
