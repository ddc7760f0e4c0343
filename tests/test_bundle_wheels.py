"""The platform wheel lock and the wheel cache (no network: a fake cache stands in for PyPI)."""

from __future__ import annotations

import json
import os
import zipfile

import pytest

from soarpack.bundle import wheels as W
from soarpack.bundle.wheels import wheel_tag_problems


def test_lock_pins_the_platform_stack_without_torch():
    lock = {w.name: w for w in W.load_lock()}
    assert lock["gptqmodel"].version == "7.6.0"
    assert lock["numpy"].version == "2.2.6"
    major, minor, *_ = (int(x) for x in lock["transformers"].version.split("."))
    assert (major, minor) >= (5, 14) and (major, minor) <= (5, 20)  # >= 5.21 needs Python 3.11
    assert "torch" not in lock and not any(n.startswith(("nvidia", "triton")) for n in lock)
    for name in ("pypcre", "device-smi", "tokenicer", "logbar", "defuser", "gptqmodel"):
        assert lock[name].source == "sdist", name
    for name in ("typer", "rich", "httpx", "pydantic", "safetensors", "tokenizers", "tomli"):
        assert name in lock, name  # soarpack's own runtime deps


def test_every_locked_binary_installs_on_the_platform_python():
    binaries = [w for w in W.load_lock() if w.source == "pypi"]
    assert all(w.filename and len(w.sha256 or "") == 64 for w in binaries)
    assert wheel_tag_problems([w.filename for w in binaries]) == []


def test_tag_check_rejects_wheels_for_another_python():
    bad = wheel_tag_problems(["numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl", "x-1-py3-none-any.whl",
                              "y-1-cp310-cp310-macosx_11_0_arm64.whl"])
    assert len(bad) == 2 and "cp311" in bad[0] and "macosx" in bad[1]


def test_pure_wheel_is_a_valid_wheel(tmp_path):
    path = W.make_pure_wheel(tmp_path, "soarpack-ci-probe", "1.0", {"probe.py": "X = 1\n"}, requires=["tomli"])
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta = zf.read("soarpack_ci_probe-1.0.dist-info/METADATA").decode()
        record = zf.read("soarpack_ci_probe-1.0.dist-info/RECORD").decode()
    assert "probe.py" in names and "Requires-Dist: tomli" in meta
    assert "probe.py,sha256=" in record


def _fake_lock(tmp_path, cache):
    pure = W.make_pure_wheel(cache, "alpha", "1.0")
    built = W.make_pure_wheel(cache, "beta", "2.0")
    lock = tmp_path / "lock.json"
    lock.write_text(json.dumps({"wheels": [
        {"name": "alpha", "version": "1.0", "source": "pypi", "filename": pure.name, "sha256": W.sha256_file(pure)},
        {"name": "beta", "version": "2.0", "source": "sdist"},
    ]}))
    return lock


@pytest.fixture
def offline_pip(monkeypatch, tmp_path):
    """pip as soarpack runs it, but with no index: it finds only what a local folder holds (the public seam is
    pip's own configuration, no soarpack internals are replaced)."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return links


def test_collect_from_a_full_cache_needs_no_network(tmp_path, offline_pip):
    cache = tmp_path / "cache"
    lock = _fake_lock(tmp_path, cache)
    names = W.collect_wheels(tmp_path / "out", cache=cache, lock_path=lock)
    assert names == ["alpha-1.0-py3-none-any.whl", "beta-2.0-py3-none-any.whl"]
    assert (tmp_path / "out" / names[0]).read_bytes() == (cache / names[0]).read_bytes()


def test_a_cached_wheel_with_the_wrong_sha256_is_fetched_again(tmp_path, offline_pip):
    cache = tmp_path / "cache"
    lock = _fake_lock(tmp_path, cache)
    good = (cache / "alpha-1.0-py3-none-any.whl").read_bytes()
    (offline_pip / "alpha-1.0-py3-none-any.whl").write_bytes(good)  # what the index serves
    (cache / "alpha-1.0-py3-none-any.whl").write_bytes(b"tampered")
    lines = []
    names = W.collect_wheels(tmp_path / "out", cache=cache, lock_path=lock, on_event=lambda e: lines.append(e.message))
    assert (cache / "alpha-1.0-py3-none-any.whl").read_bytes() == good
    assert (tmp_path / "out" / names[0]).read_bytes() == good
    assert any("downloading 1 wheels" in ln for ln in lines)


def test_a_wheel_the_index_lacks_is_named(tmp_path, offline_pip):
    cache = tmp_path / "cache"
    lock = _fake_lock(tmp_path, cache)
    (cache / "alpha-1.0-py3-none-any.whl").unlink()
    with pytest.raises(W.WheelError, match="pip download of the platform wheels failed"):
        W.collect_wheels(tmp_path / "out", cache=cache, lock_path=lock)


def test_wheel_dir_is_copied_as_is(tmp_path):
    src = tmp_path / "src"
    W.make_pure_wheel(src, "gamma", "3.0")
    assert W.collect_wheels(tmp_path / "out", wheel_dir=src) == ["gamma-3.0-py3-none-any.whl"]
    with pytest.raises(W.WheelError, match="no .whl"):
        W.collect_wheels(tmp_path / "out2", wheel_dir=tmp_path / "out2-empty")


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SOARPACK_CACHE", str(tmp_path / "c"))
    assert W.default_cache_dir() == tmp_path / "c" / "wheels"
    monkeypatch.delenv("SOARPACK_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert W.default_cache_dir() == tmp_path / "x" / "soarpack" / "wheels"
