"""Issue 39, data loss: `soarpack cache clear` deletes only what soarpack made and can prove (its marker), and refuses a
cache root that is `/`, $HOME or a parent of either. Every root here is a sandbox under tmp_path with HOME pointed
into it; the real `/` and the real home are never a cache root (root_problem is asked about "/" as a path only)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack import cache
from soarpack.cli import app

runner = CliRunner()


def _tree_digest(root: Path) -> dict:
    """Every path under root with what it is: a file's sha256, a link's target, or 'dir'."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _user_things(folder: Path) -> None:
    """What a home or a shared folder holds that soarpack never made, some of it under soarpack's entry names."""
    (folder / "Documents").mkdir(parents=True)
    (folder / "Documents" / "thesis.tex").write_text("years of work\n")
    (folder / "notes.txt").write_text("mine\n")
    (folder / "wheels").mkdir()  # a user's own folder that happens to share the wheel cache's name
    (folder / "wheels" / "my-1.0-py3-none-any.whl").write_bytes(b"mine")
    (folder / "gpu-serve").mkdir()
    (folder / "gpu-serve" / "run.sh").write_text("echo mine\n")
    (folder / "image-stack" / "cp310-torch2.9.1-0123456789ab").mkdir(parents=True)
    (folder / "image-stack" / "cp310-torch2.9.1-0123456789ab" / "data").write_bytes(b"mine")
    (folder / ".trash-wheels-123").mkdir()  # named like a leftover of an interrupted clear
    (folder / ".trash-wheels-123" / "keep.txt").write_text("mine\n")
    (folder / ".trash-wheels-456").mkdir()  # ... and an empty one
    os.symlink(folder / "Documents", folder / "docs-link")
    (folder / "elsewhere").mkdir()
    (folder / "elsewhere" / "precious").write_text("mine\n")
    os.symlink(folder / "elsewhere", folder / "wheels2")


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    for name in ("SOARPACK_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_a_cache_root_that_is_home_is_refused_and_nothing_is_deleted(sandbox, monkeypatch):
    home = sandbox / "home" / "me"
    _user_things(home)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SOARPACK_CACHE", str(home))
    before = _tree_digest(home)
    res = runner.invoke(app, ["cache", "clear", "--yes"])
    assert res.exit_code == 2, res.output
    assert "is the home folder" in res.stderr and "nothing was deleted" in res.stderr
    assert _tree_digest(home) == before
    # also by another spelling of the same folder (a trailing slash, a link to it)
    os.symlink(home, sandbox / "home-link")
    for spelled in (f"{home}/", str(sandbox / "home-link")):
        monkeypatch.setenv("SOARPACK_CACHE", spelled)
        assert runner.invoke(app, ["cache", "clear", "--yes"]).exit_code == 2
    assert _tree_digest(home) == before


def test_a_slash_like_root_holding_home_is_refused(sandbox, monkeypatch):
    """A root laid out like `/` (bin, etc, usr, home/me): a parent of HOME, refused whole."""
    fake_root = sandbox / "slash"
    for name in ("bin", "etc", "usr/lib"):
        (fake_root / name).mkdir(parents=True)
        (fake_root / name / "file").write_text("system\n")
    home = fake_root / "home" / "me"
    _user_things(home)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SOARPACK_CACHE", str(fake_root))
    before = _tree_digest(fake_root)
    res = runner.invoke(app, ["cache", "clear", "--yes"])
    assert res.exit_code == 2 and "a parent of the home folder" in res.stderr, res.output
    res = runner.invoke(app, ["cache", "clear", "stale", "--yes"])
    assert res.exit_code == 2
    assert _tree_digest(fake_root) == before


def test_root_problem_names_slash_and_home_and_their_parents(sandbox, monkeypatch):
    home = sandbox / "a" / "b" / "home"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert "filesystem root" in cache.root_problem(Path("/"))  # a question about a path: nothing is touched
    assert "is the home folder" in cache.root_problem(home)
    assert "parent of the home folder" in cache.root_problem(sandbox / "a")
    assert cache.root_problem(home / ".cache" / "soarpack") is None
    assert cache.root_problem(sandbox / "shared") is None


def test_a_shared_root_loses_only_what_soarpack_made(sandbox, monkeypatch):
    """A shared folder (not home): soarpack's marked entries go, every byte of the rest stays; exit 1 says so."""
    from soarpack.cachemark import create_marked
    from soarpack.imagestack import make_cache_dir

    shared = sandbox / "shared"
    monkeypatch.setenv("HOME", str(sandbox / "home"))
    _user_things(shared)
    user_bytes = _tree_digest(shared)
    monkeypatch.setenv("SOARPACK_CACHE", str(shared))
    # what soarpack makes there: the gpu-serve extras under a new name, a stand-in, a leftover of a clear
    ours = make_cache_dir(shared / "gpu-extra", "x")
    (ours / "pkg.py").write_text("print()\n")
    stand_in = shared / "image-stack" / "cp310-torch2.9.1-aaaaaaaaaaaa"
    assert create_marked(stand_in, f"image-stack/{stand_in.name}")
    (stand_in / "bin").mkdir()
    (stand_in / "bin" / "python").write_text("#!/bin/sh\n")
    leftover = shared / ".trash-wheels-999"
    leftover.mkdir()
    from soarpack.cachemark import mark

    mark(leftover, "wheels")
    (leftover / "half.whl").write_bytes(b"x")

    listed = json.loads(runner.invoke(app, ["--format", "json", "cache", "list"]).stdout)
    clearable = {e["name"] for e in listed["entries"] if e["clearable"]}
    assert clearable == {"gpu-extra", f"image-stack/{stand_in.name}", ".trash-wheels-999"}
    assert all(e["kept_because"] for e in listed["entries"] if e["name"] not in clearable)

    res = runner.invoke(app, ["cache", "clear", "--yes"])
    assert res.exit_code == 1, res.output
    assert "deleted 3 cache entries" in res.stdout
    assert "kept wheels: no soarpack marker" in res.stdout and "rm -rf --" in res.stdout
    assert not ours.exists() and not stand_in.exists() and not leftover.exists()
    after = _tree_digest(shared)
    left_of_users = {k: v for k, v in after.items() if not k.endswith(".lock")}
    assert left_of_users == user_bytes  # not a byte soarpack did not write is gone, nothing of it renamed


def test_an_older_soarpacks_entries_are_kept_with_how_to_remove_them(sandbox, monkeypatch):
    """A stand-in and a wheel cache made before markers existed: listed as such, left, with the rm line."""
    from soarpack.imagestack import stack_dir

    root = sandbox / "cache"
    monkeypatch.setenv("HOME", str(sandbox / "home"))
    monkeypatch.setenv("SOARPACK_CACHE", str(root))
    current = stack_dir()
    (current / "bin").mkdir(parents=True)
    (current / ".soarpack-ready.json").write_text(json.dumps({"versions": {}}))
    (root / "wheels").mkdir()
    (root / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"w")
    before = _tree_digest(root)
    text = runner.invoke(app, ["cache", "list"]).stdout
    assert "no soarpack marker in it, so clear leaves it" in text
    res = runner.invoke(app, ["cache", "clear", "--yes"])
    assert res.exit_code == 1 and "deleted 0 cache entries" in res.stdout, res.output
    assert "an older soarpack made it before markers existed" in res.stdout
    assert f"rm -rf -- {current}" in res.stdout and f"rm -rf -- {root / 'wheels'}" in res.stdout
    assert {k: v for k, v in _tree_digest(root).items() if not k.endswith(".lock")} == before


def test_make_cache_dir_marks_only_a_folder_it_creates(sandbox, monkeypatch):
    from soarpack.cachemark import marked_entry
    from soarpack.imagestack import make_cache_dir

    root = sandbox / "cache"
    monkeypatch.setenv("SOARPACK_CACHE", str(root))
    made = make_cache_dir(root / "wheels", "wheel cache")
    assert marked_entry(made) == "wheels"
    (root / "gpu-serve").mkdir()
    make_cache_dir(root / "gpu-serve", "x")
    assert marked_entry(root / "gpu-serve") is None
    # a marker reached through a link, or a marker that is a link, proves nothing
    os.symlink(made, root / "linked")
    assert marked_entry(root / "linked") is None
    (root / "faked").mkdir()
    os.symlink(made / ".soarpack-cache-entry.json", root / "faked" / ".soarpack-cache-entry.json")
    assert marked_entry(root / "faked") is None


def test_an_interrupted_clear_leaves_a_leftover_that_is_still_provably_ours(sandbox, monkeypatch):
    """The marker is deleted last: a clear cut short after the rename keeps it, and the next clear finishes."""
    from soarpack.imagestack import make_cache_dir

    root = sandbox / "cache"
    monkeypatch.setenv("HOME", str(sandbox / "home"))
    monkeypatch.setenv("SOARPACK_CACHE", str(root))
    wheels = make_cache_dir(root / "wheels", "wheel cache")
    for i in range(3):
        (wheels / f"w{i}.whl").write_bytes(b"x")
    real_unlink = os.unlink
    calls = []

    def unlink_then_die(path, *a, **k):
        calls.append(str(path))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_unlink(path, *a, **k)

    monkeypatch.setattr(os, "unlink", unlink_then_die)
    with pytest.raises(KeyboardInterrupt):
        cache.clear(cache.select(cache.entries(), ["wheels"]))
    monkeypatch.setattr(os, "unlink", real_unlink)
    (trash,) = [p for p in root.iterdir() if p.name.startswith(".trash-wheels-")]
    assert (trash / ".soarpack-cache-entry.json").is_file()
    listed = {e.name: e for e in cache.entries()}
    assert listed[trash.name].clearable and listed[trash.name].note == "deleting"
    res = runner.invoke(app, ["cache", "clear", "stale", "--yes"])
    assert res.exit_code == 0, res.output
    assert not trash.exists()
