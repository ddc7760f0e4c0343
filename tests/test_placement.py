"""Issue 23: one placement primitive for every writer. Each numbered case of the issue has its test here (the id
names it); kills and failures are injected at the seam (soarpack.placement's filesystem calls), never by timing or
privileges.

The kill tests run a writer in a child whose placement modules see an `os` (and `shutil`) that os._exit()s at the N-th
mutating call, for N = 1, 2, ... until the writer finishes: every window of a placement is hit once. After each
kill the target must be the old complete output or the new one, and the next run must clean up and say which.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

import soarpack.placement as placement
from soarpack.placement import cleanup, locks, rename
from soarpack.placement.owner import INCOMPLETE_MARKER
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.cli import app

REPO = Path(placement.__file__).resolve().parents[2]  # children import the soarpack under test
KILLED = 77


def run_cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def flat(text: str) -> str:
    return "".join(text.split())  # rich wraps long lines


def tree_hash(root: Path) -> str:
    """Names, link targets and bytes under root (a file: its bytes); "missing" when nothing is there."""
    if not os.path.lexists(root):
        return "missing"
    h = hashlib.sha256()
    paths = [root] + sorted(root.rglob("*")) if root.is_dir() else [root]
    for p in paths:
        h.update(str(p.relative_to(root.parent)).encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def hidden_leftovers(folder: Path, stem: str) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{stem}."))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "model")


# -- the seam: a child whose placement modules die at their N-th filesystem change -----------------------------

# Every module of soarpack.placement, in a child: their `os` and `shutil` are the seam.
MODULES = textwrap.dedent("""
    import importlib, pkgutil
    import soarpack.placement

    MODULES = [importlib.import_module(f"soarpack.placement.{m.name}")
               for m in pkgutil.iter_modules(soarpack.placement.__path__)]
""")


def placement_modules() -> list:
    import importlib
    import pkgutil

    return [importlib.import_module(f"soarpack.placement.{m.name}") for m in pkgutil.iter_modules(placement.__path__)]


def patch_os(monkeypatch, fake) -> None:
    """`fake` as the `os` of every placement module (the renameat2 binding's own os included)."""
    for module in placement_modules():
        if hasattr(module, "os"):
            monkeypatch.setattr(module, "os", fake)


SEAM = MODULES + textwrap.dedent("""
    import errno, os, shutil, sys
    from soarpack.placement import rename, write as f

    N, seen = int(os.environ["KILL_AT"]), [0]

    def counted(fn):
        def call(*a, **k):
            seen[0] += 1
            if seen[0] == N:
                os._exit(77)
            return fn(*a, **k)
        return call

    class Seam:
        def __init__(self, module, names):
            self._module, self._names = module, names

        def __getattr__(self, name):
            value = getattr(self._module, name)
            return counted(value) if name in self._names else value

    for module in MODULES:
        if hasattr(module, "os"):
            module.os = Seam(os, {"rename", "replace", "link", "unlink", "rmdir", "mkdir", "symlink"})
        if hasattr(module, "shutil"):
            module.shutil = Seam(shutil, {"rmtree", "copy2", "copytree"})
    real = rename.renameat2
    def renameat2(src, dst, flags):
        if os.environ.get("NO_EXCHANGE") and flags == rename.RENAME_EXCHANGE:
            raise OSError(errno.EINVAL, "Invalid argument")  # a filesystem without RENAME_EXCHANGE
        return real(src, dst, flags)
    rename.renameat2 = counted(renameat2)
""")

WRITERS = {
    # quantize's and `sglang apply --out`'s placement
    "dir": SEAM + textwrap.dedent("""
        with f.atomic_dir(sys.argv[1], force=True) as tmp:
            (tmp / "model.safetensors").write_bytes(b"new weights" * 100)
            (tmp / "config.json").write_text('{"new": true}')
    """),
    # build's, the results', speedset's and calib's placement
    "file": SEAM + textwrap.dedent("""
        with f.placing(sys.argv[1], force=True) as st:
            st.path.write_bytes(b"a new bundle" * 100)
    """),
    # in-place `sglang apply`
    "apply": SEAM + textwrap.dedent("""
        from soarpack.serve.patches import apply_patches
        apply_patches(sys.argv[1], sys.argv[1], verify_compile=False)
    """),
}


def killed_at(kind: str, target: Path, n: int, **env: str) -> int:
    proc = subprocess.run([sys.executable, "-c", WRITERS[kind], str(target)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO), KILL_AT=str(n), **env), cwd=REPO, timeout=120)
    assert proc.returncode in (0, KILLED), proc.stderr[-3000:]
    return proc.returncode


def old_dir(target: Path) -> None:
    target.mkdir()
    (target / "model.safetensors").write_bytes(b"old weights" * 100)
    (target / "config.json").write_text('{"old": true}')


def check_said(lines: list, target: Path, old: str, new: str) -> None:
    """What the next run said must match what is there."""
    text = " ".join(lines)
    now = tree_hash(target)
    if "is the new output" in text or "rolled forward" in text:
        assert now == new, text
    if "is the old output" in text or "rolled back" in text:
        assert now == old, text


@pytest.mark.parametrize("mode", ["exchange", "journal"])
@pytest.mark.parametrize("kind", ["dir", "file"])
def test_case_2_a_kill_at_any_step_leaves_the_old_or_the_new_output(tmp_path, kind, mode):
    target = tmp_path / "q"
    if kind == "dir":
        old_dir(target)
    else:
        target.write_bytes(b"an old bundle" * 100)
    old = tree_hash(target)
    done = tmp_path / "done" / "q"
    done.parent.mkdir()
    env = {"NO_EXCHANGE": "1"} if mode == "journal" else {}
    assert killed_at(kind, done, 10**6, **env) == 0
    new = tree_hash(done)
    kills, problems = 0, []
    for n in range(1, 60):
        # every run starts from the old output, with no leftovers of the previous one
        subprocess.run(["rm", "-rf", str(target), *map(str, tmp_path.glob(".q.*"))], check=True)
        old_dir(target) if kind == "dir" else target.write_bytes(b"an old bundle" * 100)
        if killed_at(kind, target, n, **env) == 0:
            assert tree_hash(target) == new
            break
        kills += 1
        journaled = any(p.name.endswith(".journal") for p in tmp_path.iterdir())
        # Without RENAME_EXCHANGE the two renames leave a moment without OUT: the journal beside it covers it.
        if not (tree_hash(target) in (old, new) or (mode == "journal" and journaled)):
            problems.append(f"killed at step {n}: {target} is {'missing' if not target.exists() else 'neither old nor new'}")
        for tmp in (p for p in tmp_path.glob(".q.tmp-*") if p.is_dir()):
            # a leftover is never taken for a result, whether or not its marker was already gone
            owner = locks.temp_owner(tmp)
            if owner is None or owner[1] != "gone":
                problems.append(f"killed at step {n}: {tmp.name} does not say it is a killed run's temp")
        lines: list = []
        cleanup.remove_stale_temps(target, lines.append)
        if hidden_leftovers(tmp_path, "q"):
            problems.append(f"killed at step {n}: the next run left {hidden_leftovers(tmp_path, 'q')}")
        if tree_hash(target) not in (old, new):
            problems.append(f"killed at step {n}: after the next run {target} is still neither old nor new")
        check_said(lines, target, old, new)
    else:
        pytest.fail("the writer never finished")
    assert problems == [], "\n".join(problems)
    assert kills >= 2  # the seam saw the placement's steps


def test_case_3_in_place_apply_killed_at_any_step_is_all_old_or_all_new(tmp_path):
    from test_serve_patches import write_anchor_tree
    from soarpack.serve.patches import apply_patches, check_tree

    done = write_anchor_tree(tmp_path / "done")
    apply_patches(done, done, verify_compile=False)
    fork = write_anchor_tree(tmp_path / "fork")
    old = tree_hash(fork)
    new = {p.relative_to(done): p.read_bytes() for p in done.rglob("*") if p.is_file()}
    kills, problems = 0, []
    for n in range(1, 80):
        subprocess.run(["rm", "-rf", str(tmp_path / "fork")], check=True)
        fork = write_anchor_tree(tmp_path / "fork")
        if killed_at("apply", fork, n) == 0:
            break
        kills += 1
        check_tree(fork)  # the next run: it finishes the killed one's journal first
        now = {p.relative_to(fork): p.read_bytes() for p in fork.rglob("*") if p.is_file()}
        if not (tree_hash(fork) == old or now == new):
            problems.append(f"killed at step {n}: the tree is half patched")
        hidden = [p.name for p in (tmp_path / "fork").rglob(".*")]
        if hidden:
            problems.append(f"killed at step {n}: hidden files stay: {hidden}")
        try:
            apply_patches(fork, fork, verify_compile=False)  # a rerun works
            assert {p.status for p in check_tree(fork).patches} == {"applied"}
        except Exception as exc:
            problems.append(f"killed at step {n}: the rerun fails: {exc}")
    else:
        pytest.fail("apply never finished")
    assert problems == [], "\n".join(problems)
    assert kills >= 4


def test_case_3_the_next_run_says_it_rolled_back(tmp_path):
    from test_serve_patches import write_anchor_tree

    # the first kill after which some file is already new (and the journal is still there)
    for n in range(1, 40):
        subprocess.run(["rm", "-rf", str(tmp_path / "fork")], check=True)
        fork = write_anchor_tree(tmp_path / "fork")
        old = tree_hash(fork)
        if killed_at("apply", fork, n) == 0:
            pytest.fail("no kill left the tree half patched")
        if tree_hash(fork) != old:
            break
    res = run_cli("sglang", "check", "--sglang-src", fork)  # the next run: the CLI says what its cleanup did
    assert "note:rolledback" in flat(res.stderr) and tree_hash(fork) == old, res.output


# -- case 1: inputs are never written over ---------------------------------------------------------------------


def test_case_1_bench_output_is_its_speed_input(tmp_path, tokenizer_dir):
    from soarpack.serve.fake_server import FakeSGLang

    s1 = tmp_path / "s1.jsonl"
    s1.write_text('{"question": "hi there, how are you", "model_response": "fine thanks"}\n')
    before = s1.read_bytes()
    with FakeSGLang() as server:  # a server that answers: before, the bench ran and wrote over s1.jsonl
        res = run_cli("bench", "--api-base", server.url, "--s1", s1, "--model-dir", tokenizer_dir, "-o", s1,
                      "--no-warmup", "--no-flush", "--settle", "0")
    assert res.exit_code == 2 and flat(f"bench output {s1} is the input {s1}") in flat(res.output), res.output
    assert s1.read_bytes() == before


@pytest.mark.needs_torch
def test_case_1_calib_write_builtin_is_its_input(tmp_path, tokenizer_dir):
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"text": "my own calibration row, long enough to count: the river town had one bridge"}\n')
    before = mine.read_bytes()
    res = run_cli("calib", mine, "--model-dir", tokenizer_dir, "--write-builtin", mine)
    assert res.exit_code == 2 and flat(f"--write-builtin {mine} is the input {mine}") in flat(res.output), res.output
    assert mine.read_bytes() == before


@pytest.mark.needs_torch
def test_case_1_calib_write_builtin_over_another_file_needs_force(tmp_path, tokenizer_dir):
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"text": "my own calibration row, long enough to count: the river town had one bridge"}\n')
    other = tmp_path / "other.jsonl"
    other.write_text('{"text": "not the built-in prompts"}\n')
    args = ["calib", mine, "--model-dir", tokenizer_dir, "--write-builtin", other, "-n", "4"]
    res = run_cli(*args)
    assert res.exit_code == 2 and "--force" in res.output and "not the built-in" in other.read_text(), res.output
    forced = run_cli(*args, "--force")
    assert forced.exit_code == 0 and "not the built-in" not in other.read_text(), forced.output
    again = run_cli(*args)  # the same prompts: up to date, no --force needed
    assert again.exit_code == 0 and "uptodate" in flat(again.output), again.output


def test_case_1_speedset_output_inside_its_model_dir(tmp_path, tokenizer_dir):
    model = tmp_path / "m"
    subprocess.run(["cp", "-r", str(tokenizer_dir), str(model)], check=True)
    before = tree_hash(model)
    res = run_cli("speedset", "--model-dir", model, "-n", "2", "-o", model / "tokenizer.json", "--force")
    assert res.exit_code == 2 and "wouldreplacesomethinginsidetheinput" in flat(res.output), res.output
    assert tree_hash(model) == before


def test_case_1_speedset_output_is_its_text(tmp_path, tokenizer_dir):
    text = tmp_path / "t.txt"
    text.write_text("the river town had one bridge and many boats. " * 200)
    before = text.read_bytes()
    res = run_cli("speedset", "--model-dir", tokenizer_dir, "--text", text, "-n", "2", "-o", text, "--force")
    assert res.exit_code == 2 and flat(f"speedset output {text} is the input {text}") in flat(res.output), res.output
    assert text.read_bytes() == before


def test_case_2_an_old_output_an_earlier_version_left_aside_comes_back(tmp_path):
    """What a646cc5 left after a kill between its two renames: no OUT, the old output in .OUT.old-PID forever."""
    out = tmp_path / "q"
    aside = tmp_path / ".q.old-4242"
    old_dir(aside)
    (tmp_path / "ref").mkdir()
    old_dir(tmp_path / "ref" / "q")
    old = tree_hash(tmp_path / "ref" / "q")
    lines: list = []
    cleanup.remove_stale_temps(out, lines.append)
    assert out.is_dir() and not aside.exists(), lines
    assert tree_hash(out) == old and any("restored" in line for line in lines)


def test_case_2_verify_of_a_killed_runs_unmarked_temp_folder_is_not_ok(tiny_model_dir, tmp_path):
    """Killed after its marker went and before the swap: a complete-looking folder without a marker. Its lock file,
    which nobody holds any more, still says what it is."""
    tmp = tmp_path / ".q.tmp-k1lled00"
    subprocess.run(["cp", "-r", str(tiny_model_dir), str(tmp)], check=True)
    (tmp_path / ".q.tmp-k1lled00.lock").write_text(json.dumps({"target": "q", "pid": 1, "host": "elsewhere"}))
    assert not (tmp / INCOMPLETE_MARKER).exists()
    res = run_cli("verify", tmp)
    assert res.exit_code == 1 and "[incomplete]" in res.output and "killedbeforeitfinished" in flat(res.output), \
        res.output


# -- case 2, the messages: one line per leftover, no doubled "note:" -------------------------------------------------


def test_case_2_a_folder_without_marker_is_reported_once_without_a_doubled_note(tiny_model_dir, tmp_path):
    out = tmp_path / "q"
    stray = tmp_path / ".q.tmp-abc123"
    stray.mkdir()
    (stray / "model.safetensors").write_bytes(b"x")
    # --max-len over dense_len fails right after the check phase: enough to see the cleanup's lines
    res = run_cli("quantize", tiny_model_dir, out, "--rows", "4", "--max-len", "8192", "--device", "cpu")
    assert res.exit_code == 2
    text = flat(res.output)
    assert text.count("hasnoownermarker") == 1, res.output
    assert "note:note:" not in text, res.output
    assert stray.is_dir()  # not ours to judge: left alone


# -- case 4: liveness by a lock the kernel drops at death, not by host + pid + boot id -----------------------------


LIVE = textwrap.dedent("""
    import sys
    from soarpack.placement.write import atomic_dir
    with atomic_dir(sys.argv[1], force=True) as tmp:
        (tmp / "model.safetensors").write_bytes(b"a long run's weights")
        print(tmp, flush=True)
        sys.stdin.readline()  # until the test lets it finish
    print("placed", flush=True)
""")


def test_case_4_a_live_run_in_another_pid_namespace_keeps_its_temp_folder(tmp_path):
    out = tmp_path / "q"
    live = subprocess.Popen([sys.executable, "-c", LIVE, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    try:
        tmp = Path(live.stdout.readline().strip())
        # Seen from another container on the same host (same host name and boot id), the owner's pid is some
        # pid that does not exist here: a reaped child's.
        gone = subprocess.Popen(["true"])
        gone.wait()
        marker = tmp / INCOMPLETE_MARKER
        owner = json.loads(marker.read_text())
        marker.write_text(json.dumps({**owner, "pid": gone.pid, "process_start": None}))
        lines: list = []
        cleanup.remove_stale_temps(out, lines.append)
        assert tmp.is_dir(), f"a live run's temp folder was removed: {lines}"
        # the lock is beside the temp folder, never inside it (what is inside ships)
        assert Path(f"{tmp}.lock").is_file() and not [p for p in tmp.rglob("*") if "lock" in p.name]
        assert any("running" in line for line in lines)
        live.stdin.write("\n")
        live.stdin.flush()
        assert live.stdout.readline().strip() == "placed"
        assert live.wait(timeout=60) == 0
        assert (out / "model.safetensors").read_bytes() == b"a long run's weights"
        assert hidden_leftovers(tmp_path, "q") == []
    finally:
        live.kill()
        live.wait()


def _killed_writer(out: Path) -> None:
    code = ("import os, sys\nfrom soarpack.placement.write import atomic_dir\n"
            "with atomic_dir(sys.argv[1], force=True) as tmp:\n    (tmp / 'w').write_bytes(b'x')\n    os._exit(9)\n")
    subprocess.run([sys.executable, "-c", code, str(out)], env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO,
                   check=False)
    assert [p for p in out.parent.glob(f".{out.name}.tmp-*") if p.is_dir()]


def test_the_cleanup_of_a_writer_says_nothing_unless_given_a_log(tmp_path, capfd):
    from soarpack.placement.write import atomic_dir

    out = tmp_path / "q"
    _killed_writer(out)
    with atomic_dir(out) as tmp:  # no log: the killed run's temp goes, silently
        (tmp / "w").write_bytes(b"new")
    assert capfd.readouterr() == ("", "") and hidden_leftovers(tmp_path, "q") == []
    _killed_writer(out)
    lines: list = []
    with atomic_dir(out, force=True, log=lines.append) as tmp:
        (tmp / "w").write_bytes(b"newer")
    assert len(lines) == 1 and "killed" in lines[0] and capfd.readouterr() == ("", "")


def test_a_dead_lock_holder_is_cleaned_up_and_named(tmp_path):
    out = tmp_path / "q"
    code = ("import os, sys\nfrom soarpack.placement.write import atomic_dir\n"
            "with atomic_dir(sys.argv[1]) as tmp:\n    (tmp / 'w').write_bytes(b'x')\n    os._exit(9)\n")
    subprocess.run([sys.executable, "-c", code, str(out)], env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO,
                   check=False)
    assert [p for p in tmp_path.glob(".q.tmp-*") if p.is_dir()]
    lines: list = []
    cleanup.remove_stale_temps(out, lines.append)
    assert len(lines) == 1 and "killed" in lines[0] and "never written" in lines[0], lines
    assert hidden_leftovers(tmp_path, "q") == [] and not out.exists()


# -- case 5: the existing-output check happens at placement -------------------------------------------------------


def _build_racing(tmp_path, monkeypatch, other: bytes):
    """A build to -o X during which another build places X (injected where the tarball is written)."""
    import soarpack.bundle.build as build

    out = tmp_path / "b.tar.gz"
    real = build.write_tarball

    def and_another_build_finishes(stage, path):
        real(stage, path)
        out.write_bytes(other if other else Path(path).read_bytes())

    monkeypatch.setattr(build, "write_tarball", and_another_build_finishes)
    return out, run_cli("build", "--no-wheels", "-o", out)


def test_case_5_two_builds_to_one_output_cannot_both_succeed(tmp_path, monkeypatch):
    out, res = _build_racing(tmp_path, monkeypatch, b"the other build's bundle")
    assert res.exit_code == 2 and "--force" in res.output, res.output
    assert out.read_bytes() == b"the other build's bundle"
    assert hidden_leftovers(tmp_path, "b.tar.gz") == []


def test_case_5_the_other_build_of_the_same_bytes_is_up_to_date(tmp_path, monkeypatch):
    out, res = _build_racing(tmp_path, monkeypatch, b"")
    assert res.exit_code == 0 and "uptodate" in flat(res.output), res.output


def test_case_5_an_unwritable_target_at_placement_is_one_line_and_keeps_the_old(tmp_path, monkeypatch):
    """EROFS injected at the seam (the final rename), as a read-only remount between check and placement."""
    out = tmp_path / "b.tar.gz"
    out.write_bytes(b"an older bundle")

    class ReadOnlyAtPlacement:
        def __getattr__(self, name):
            if name in ("rename", "replace", "link"):
                def refuse(*a, **k):
                    raise OSError(errno.EROFS, "Read-only file system")
                return refuse
            return getattr(os, name)

    import soarpack.bundle.build as build

    real = build.write_tarball

    def then_read_only(stage, path):
        real(stage, path)
        patch_os(monkeypatch, ReadOnlyAtPlacement())
        monkeypatch.setattr(rename, "renameat2", ReadOnlyAtPlacement().rename)

    monkeypatch.setattr(build, "write_tarball", then_read_only)
    res = run_cli("build", "--no-wheels", "-o", out, "--force")
    monkeypatch.undo()
    assert res.exit_code == 2 and "Read-only file system" in res.output and "Traceback" not in res.output, res.output
    assert out.read_bytes() == b"an older bundle"
    assert hidden_leftovers(tmp_path, "b.tar.gz") == []


# -- case 6: the quick start runs twice --------------------------------------------------------------------------


def test_case_6_the_quick_start_build_runs_twice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = run_cli("build", "--no-wheels")
    assert first.exit_code == 0, first.output
    name = first.stdout.strip()
    second = run_cli("build", "--no-wheels")
    assert second.exit_code == 0, second.output
    assert second.stdout.strip() == name and "uptodate" in flat(second.stderr)
    assert sorted(os.listdir(tmp_path)) == [name]


# -- case 7: no log path that vanishes with the old OUT -------------------------------------------------------------


def test_case_7_a_log_inside_out_is_refused_before_any_work(tiny_model_dir, tmp_path):
    out = tmp_path / "q"
    old_dir(out)
    before = tree_hash(out)
    res = run_cli("quantize", tiny_model_dir, out, "--log", out / "run.log", "--force", "--rows", "4",
                  "--max-len", "128", "--device", "cpu", "--no-report")
    assert res.exit_code == 2, res.output
    assert flat(f"--log {out / 'run.log'} is inside {out}") in flat(res.output), res.output
    assert f"log: {out / 'run.log'}" not in res.output  # no path to a log that does not exist
    assert tree_hash(out) == before and not (out / "run.log").exists()


# -- end to end: quantize --force killed inside its placement ----------------------------------------------------

QUANTIZE_KILLED = MODULES + textwrap.dedent("""
    import errno, os, sys
    from soarpack.placement import rename as f

    real = f.renameat2
    def renameat2(src, dst, flags):
        if flags == f.RENAME_EXCHANGE:
            if os.environ["MODE"] == "journal":
                raise OSError(errno.EINVAL, "Invalid argument")  # no RENAME_EXCHANGE here: the journal
            real(src, dst, flags)
            os._exit(77)  # the new checkpoint is in place, the old one not yet removed
        return real(src, dst, flags)
    f.renameat2 = renameat2

    class Seam:  # journal: killed between its two renames
        renames = 0
        def __getattr__(self, name):
            if name == "rename":
                def rename(*a):
                    Seam.renames += 1
                    if Seam.renames == 2:
                        os._exit(77)
                    return os.rename(*a)
                return rename
            return getattr(os, name)
    if os.environ["MODE"] == "journal":
        for module in MODULES:
            if hasattr(module, "os"):
                module.os = Seam()
    from soarpack.cli import main
    main(sys.argv[1:])
""")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exchange", "journal"])
def test_quantize_killed_while_placing_leaves_a_complete_output_and_the_next_run_says_which(tiny_model_dir, tmp_path,
                                                                                           mode):
    out = tmp_path / "q"
    old_dir(out)
    old = tree_hash(out)
    fast = ["--rows", "4", "--max-len", "128", "--device", "cpu", "--no-report"]
    proc = subprocess.run([sys.executable, "-c", QUANTIZE_KILLED, "quantize", str(tiny_model_dir), str(out), *fast,
                           "--force"], capture_output=True, text=True, timeout=900, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO), MODE=mode, GPTQMODEL_CPU_WORKERS="2"))
    assert proc.returncode == KILLED, proc.stderr[-3000:]
    if mode == "exchange":
        assert tree_hash(out) != old and run_cli("verify", out).exit_code == 0  # the new checkpoint, complete
    else:
        assert not out.exists()  # between the journal's two renames: the next run rolls it back
    new = tree_hash(out)
    # the next run (stopped after its check phase by a --max-len over dense_len) cleans up and says which
    res = run_cli("quantize", tiny_model_dir, out, "--rows", "4", "--max-len", "8192", "--device", "cpu")
    assert res.exit_code == 2
    text = flat(res.output)
    if mode == "exchange":
        assert f"{out}isthenewoutput" in text and tree_hash(out) == new, res.output
    else:
        assert "rolledback" in text and tree_hash(out) == old, res.output
    assert hidden_leftovers(tmp_path, "q") == []
    assert "note:note:" not in text


def test_in_place_apply_refused_midway_at_the_seam_changes_nothing(tmp_path, monkeypatch):
    """EROFS injected at the third rename of an in-place apply (no chattr, no root needed): all old, nothing left."""
    from test_serve_patches import write_anchor_tree
    from soarpack.serve.patches import PatchError, apply_patches, check_tree

    fork = write_anchor_tree(tmp_path / "fork")
    before = tree_hash(fork)
    calls = [0]

    class RefusesTheThirdRename:
        def __getattr__(self, name):
            real = getattr(os, name)
            if name not in ("rename", "replace"):
                return real

            def rename(*a, **k):
                calls[0] += 1
                if calls[0] == 3:
                    raise OSError(errno.EROFS, "Read-only file system", str(a[1]))
                return real(*a, **k)
            return rename

    patch_os(monkeypatch, RefusesTheThirdRename())
    with pytest.raises(PatchError, match="Read-only file system; nothing was changed"):
        apply_patches(fork, fork, verify_compile=False)
    monkeypatch.undo()
    assert tree_hash(fork) == before and [p.name for p in (tmp_path / "fork").rglob(".*")] == []
    assert {p.status for p in check_tree(fork).patches} == {"apply"}
