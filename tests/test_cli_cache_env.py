"""`soarpack cache list|clear` and `soarpack env` over a temporary SOARPACK_CACHE; clear honours held locks."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack import __version__, cachelock
from soarpack.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache with the current image stand-in (a ready marker and a python), an old one, wheels and gpu-serve."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SOARPACK_CACHE", str(root))
    from soarpack.imagestack import stack_dir

    current = stack_dir()
    (current / "bin").mkdir(parents=True)
    os.symlink(sys.executable, current / "bin" / "python")
    (current / ".soarpack-ready.json").write_text(json.dumps({"versions": {"python": "3.10.13", "torch": "2.9.1"}}))
    (current / "lib.bin").write_bytes(b"x" * 300_000)
    old = root / "image-stack" / "cp310-torch2.0.0-0123456789ab"
    old.mkdir()
    (old / "big").write_bytes(b"y" * 100_000)
    (root / "wheels").mkdir()
    (root / "wheels" / "a-1.0-py3-none-any.whl").write_bytes(b"w" * 50_000)
    (root / "gpu-serve").mkdir()
    os.symlink("/nonexistent/outside", root / "gpu-serve" / "link.whl")  # never followed, only the link goes
    from soarpack.cachemark import mark

    for name in (f"image-stack/{current.name}", f"image-stack/{old.name}", "wheels", "gpu-serve"):
        mark(root / name, name)  # what soarpack writes when it makes each entry
    return root, current, old


def _names(doc):
    return [e["name"] for e in doc["entries"]]


def _json(args):
    a = runner.invoke(app, ["--format", "json", *args])
    b = runner.invoke(app, [*args, "--json"])
    assert a.exit_code == b.exit_code == 0, (a.output, b.output)
    return json.loads(a.stdout), json.loads(b.stdout)


def _holder(code: str):
    """A child process that runs `code` (it takes a lock), says `held` and waits: a running check or build."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-c", code + "\nprint('held', flush=True)\nimport time; time.sleep(60)"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.strip() == "held", proc.stderr.read() if proc.poll() is not None else line
    return proc


def test_list_shows_every_entry_with_its_size(cache):
    root, current, old = cache
    a, b = _json(["cache", "list"])
    assert a["entries"] == b["entries"] and a["root"] == str(root)
    assert _names(a) == ["gpu-serve", f"image-stack/{old.name}", f"image-stack/{current.name}", "wheels"]
    size = {e["name"]: e["bytes"] for e in a["entries"]}
    assert size[f"image-stack/{current.name}"] >= 300_000 and size["wheels"] >= 50_000
    assert a["total_bytes"] == sum(size.values()) and a["free_bytes"] > 0
    note = {e["name"]: e["note"] for e in a["entries"]}
    assert note[f"image-stack/{current.name}"] == "current"
    assert note[f"image-stack/{old.name}"].startswith("not the stand-in this soarpack uses")
    text = runner.invoke(app, ["cache", "list"]).stdout
    assert f"cache: {root} ($SOARPACK_CACHE)" in text and "in all;" in text and "free there" in text


def test_clear_is_a_dry_run_without_yes_off_a_terminal(cache):
    root, current, old = cache
    res = runner.invoke(app, ["cache", "clear"])
    assert res.exit_code == 0 and "nothing deleted (a dry run): add --yes" in res.stdout
    assert current.is_dir() and old.is_dir() and (root / "wheels").is_dir()
    a, _ = _json(["cache", "clear", "wheels"])
    assert a["dry_run"] is True and a["deleted"] is False and _names(a) == ["wheels"]
    assert (root / "wheels").is_dir()


def test_clear_stale_deletes_only_what_this_soarpack_no_longer_uses(cache):
    root, current, old = cache
    res = runner.invoke(app, ["cache", "clear", "stale", "--yes"])
    assert res.exit_code == 0, res.output
    assert "deleted 1 cache entry" in res.stdout
    assert not old.exists() and current.is_dir() and (root / "wheels").is_dir()
    assert not [p for p in root.iterdir() if p.name.startswith(".trash-")]


def test_clear_all_leaves_the_locks_and_nothing_else(cache):
    root, current, _ = cache
    res = runner.invoke(app, ["cache", "clear", "--yes"])
    assert res.exit_code == 0, res.output
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert left == sorted(["image-stack", f"image-stack/{current.name}.lock",
                           "image-stack/cp310-torch2.0.0-0123456789ab.lock", "wheels.lock"])
    assert runner.invoke(app, ["cache", "list"]).stdout.count("(empty)") == 1


def test_unknown_name_is_one_error_line(cache):
    res = runner.invoke(app, ["cache", "clear", "nosuch", "--yes"])
    assert res.exit_code == 2 and "error: nothing in the cache is called 'nosuch'" in res.stderr
    assert "wheels" in res.stderr


def test_a_running_check_holds_the_stand_in_and_clear_refuses(cache):
    """ensure_image_stack (what check and serve-check call) holds the stand-in's lock shared until its process ends."""
    root, current, old = cache
    proc = _holder("from soarpack.imagestack import ensure_image_stack; ensure_image_stack()")
    try:
        listed, _ = _json(["cache", "list"])
        entry = {e["name"]: e for e in listed["entries"]}[f"image-stack/{current.name}"]
        assert entry["in_use"] and any(f"pid {proc.pid}" in h for h in entry["holders"]), entry
        res = runner.invoke(app, ["cache", "clear", "--yes"])
        assert res.exit_code == 2
        assert f"error: not cleared: in use (image-stack/{current.name} by pid {proc.pid}" in res.stderr
        assert "nothing was deleted" in res.stderr and "hint: wait for that build or check" in res.stderr
        assert current.is_dir() and old.is_dir() and (root / "wheels").is_dir()  # nothing deleted, not even the rest
        env = json.loads(runner.invoke(app, ["--format", "json", "env"]).stdout)
        assert any(f"pid {proc.pid}" in h for h in env["image_stand_in"]["in_use_by"])
    finally:
        proc.kill()
        proc.wait()
    res = runner.invoke(app, ["cache", "clear", "image-stack", "--yes"])
    assert res.exit_code == 0, res.output
    assert not current.exists() and not old.exists() and (root / "wheels").is_dir()


def test_a_running_build_of_the_stand_in_blocks_clear(cache):
    """The stand-in's builder holds the same lock exclusively (imagestack._locked): clear does not wait, it refuses."""
    _, current, _ = cache
    lock = cachelock.lock_path(current)
    proc = _holder(f"import fcntl; fh = open({str(lock)!r}, 'w'); fcntl.flock(fh, fcntl.LOCK_EX)")
    try:
        res = runner.invoke(app, ["cache", "clear", f"image-stack/{current.name}", "--yes"])
        assert res.exit_code == 2 and f"by pid {proc.pid}" in res.stderr
        assert current.is_dir()
    finally:
        proc.kill()
        proc.wait()


def test_the_wheel_cache_is_held_while_wheels_are_fetched(cache, monkeypatch):
    from soarpack.bundle import wheels

    root, _, _ = cache
    seen = []
    monkeypatch.setattr(wheels, "_fetch_into_cache", lambda *a: seen.append(cachelock.is_busy(root / "wheels")))
    wheels.fetch_into_cache([], root / "wheels")
    assert seen == [True] and not cachelock.is_busy(root / "wheels")
    fd = os.open(cachelock.lock_path(root / "wheels"), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a build copying wheels (collect_wheels) holds it so too
    try:
        res = runner.invoke(app, ["cache", "clear", "wheels", "--yes"])
        assert res.exit_code == 2 and "error: not cleared: in use (wheels by pid" in res.stderr
    finally:
        os.close(fd)


def test_env_reports_versions_python310_stand_in_and_cache(cache, monkeypatch):
    root, current, _ = cache
    a, b = _json(["env"])
    for doc in (a, b):  # the disk's free space moves between two runs
        assert doc["cache"].pop("free_bytes") > 0
    assert a == b
    v = a["versions"]
    assert v["soarpack"] == __version__ and v["python"] == sys.version.split()[0]
    for name in ("torch", "transformers", "gptqmodel"):
        try:
            assert v[name] == metadata.version(name)
        except metadata.PackageNotFoundError:
            assert v[name] is None
    stand_in = a["image_stand_in"]
    assert stand_in["built"] is True and stand_in["key"] == current.name and stand_in["path"] == str(current)
    assert stand_in["versions"]["torch"] == "2.9.1" and stand_in["in_use_by"] == []
    assert a["cache"]["root"] == str(root) and a["cache"]["set_by"] == "SOARPACK_CACHE"
    assert [e["name"] for e in a["cache"]["entries"]][-1] == "wheels"
    text = runner.invoke(app, ["env"]).stdout
    assert f"image stand-in: built, key {current.name}" in text and f"cache: {root} ($SOARPACK_CACHE)" in text
    assert "versions: soarpack " in text and "free there" in text


def test_env_says_how_the_python310_was_found(cache, monkeypatch, tmp_path):
    from soarpack.imagestack import find_python310

    bogus = tmp_path / "python3.10"
    bogus.write_text("#!/bin/sh\nexit 1\n")
    bogus.chmod(0o755)
    monkeypatch.setenv("SOARPACK_PYTHON310", str(bogus))
    py = json.loads(runner.invoke(app, ["--format", "json", "env"]).stdout)["python310"]
    assert py["SOARPACK_PYTHON310"] == str(bogus) and py["searched"][1] == "$SOARPACK_PYTHON310"
    if sys.version_info[:2] != (3, 10):
        assert py["note"].startswith(f"SOARPACK_PYTHON310={bogus} is not a CPython 3.10")
        assert py["found_by"] != "$SOARPACK_PYTHON310"
    real = find_python310()
    if real is None:
        pytest.skip("no CPython 3.10 here to point SOARPACK_PYTHON310 at")
    monkeypatch.setenv("SOARPACK_PYTHON310", real)
    py = json.loads(runner.invoke(app, ["--format", "json", "env"]).stdout)["python310"]
    assert py["path"] == (sys.executable if sys.version_info[:2] == (3, 10) else real) and py["note"] is None


def test_env_imports_no_torch(cache):
    code = ("import sys\nfrom soarpack.cli import main\ntry:\n    main(['env', '--no-sizes'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip().endswith("NO-TORCH"), out.stdout + out.stderr
    assert "versions: soarpack" in out.stdout


def test_a_held_lock_of_a_read_only_cache_is_best_effort(tmp_path):
    """Where the lock cannot be made (no such folder), using the folder is not refused: nothing is held."""
    cachelock.hold_shared(tmp_path / "missing" / "stack")
    assert not cachelock.is_busy(tmp_path / "missing" / "stack")
    cachelock.release_shared(tmp_path / "missing" / "stack")


@pytest.mark.parametrize("words", [("cache", "list"), ("cache", "clear"), ("cache",), ("env",)])
def test_help_pages_read_at_80_columns_with_an_example(words):
    res = CliRunner().invoke(app, [*words, "-h"], env={"COLUMNS": "80"}, terminal_width=80)
    assert res.exit_code == 0 and "Example" in res.output
    assert all(len(line) <= 80 for line in res.output.splitlines())
