"""Issue 39, part B: rehearse-server, hangs, deep TOML and what was left from the earlier sweep. Each test is a case
the sweep of 9ef8388 found: a server child that ignores SIGTERM, --ready-timeout nan, --max-tokens 1, built-in
calibration rows by the hundred million, a deep-nested recipe, .ndjson and .JSONL rows counted as one, a full disk
under `sglang apply` and `quantize --log`, `quantize ../tiny .`, and `check` choosing a bundle by a future mtime.

Nothing here waits on a timer for its verdict: where a test waits, it waits for a condition (bounded generously for
a loaded machine), and where a hang is the defect, a counter stops the old code instead of the clock."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from soarpack.bundle.build import build_bundle, newest_bundle
from cli_results import one_error_line, run_cli
from soarpack.errors import ConfigError, SoarpackError
from soarpack.quant import calib as C

ROOT = Path(__file__).resolve().parent.parent




def _wait_for(condition, limit_s=120.0):
    """Poll until `condition()`: a bound for a loaded machine, not a timing check."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _gone(pid: int) -> bool:
    """The process no longer runs (exited; a zombie not yet reaped by its new parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except FileNotFoundError:
        return True


# -- rehearse-server ---------------------------------------------------------------------------------------------

LEADER_AND_STUBBORN_CHILD = r'''
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "while True: time.sleep(1)\n", sys.argv[1]])
while True:  # the leader obeys SIGTERM (Python's default: it dies at once)
    time.sleep(1)
'''


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="not run: reads /proc to tell a zombie from a live child")
def test_stop_kills_a_child_that_ignores_sigterm_after_the_leader_has_gone(tmp_path):
    from soarpack.serve.server import Server

    pidfile = tmp_path / "child.pid"
    proc = subprocess.Popen([sys.executable, "-c", LEADER_AND_STUBBORN_CHILD, str(pidfile)], start_new_session=True)
    server = Server(proc, "http://127.0.0.1:9", tmp_path / "server.log", [])
    try:
        assert _wait_for(lambda: pidfile.is_file() and pidfile.read_text().strip())  # SIGTERM is ignored from here
        child = int(pidfile.read_text())
        code = server.stop(grace_s=1.0)
        assert code == -signal.SIGTERM  # the leader obeyed
        assert _wait_for(lambda: _gone(child)), "the child that ignored SIGTERM is still running"
        assert server.stop() == code  # a second stop does nothing (the group id may be reused)
    finally:
        for pid in [proc.pid] + ([int(pidfile.read_text())] if pidfile.is_file() and pidfile.read_text() else []):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5"])
def test_rehearse_server_ready_timeout_must_be_a_time(tmp_path, value):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"task": "qa", "question": "q", "gold": ["x"]}) + "\n")
    # a NaN wait never ends: refused before anything is read or started (no checkpoint needed to see it)
    result = run_cli("rehearse-server", tmp_path / "nope", "--data", data, "--ready-timeout", value,
                     "-o", tmp_path / "out")
    one_error_line(result, "--ready-timeout", "not a time in seconds")
    assert not (tmp_path / "out").exists()
    from soarpack.serve.server import start_server

    with pytest.raises(ConfigError, match="not a time in seconds"):
        start_server(["true"], 9, tmp_path / "log", timeout_s=float(value))


def test_rehearse_server_max_tokens_below_the_shortest_bench_answer_is_one_error_line(tiny_model_dir, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"task": "qa", "question": "q", "gold": ["x"]}) + "\n")
    for n in (1, 3):
        result = run_cli("rehearse-server", tiny_model_dir, "--data", data, "--max-tokens", n, "-o", tmp_path / "out",
                         "--python", "/nonexistent/python")
        one_error_line(result, f"--max-tokens {n} is below the short bench's shortest answer")
    assert not (tmp_path / "out").exists()  # refused before anything was written


# -- hangs: built-in calibration rows by the hundred million ------------------------------------------------------


@pytest.fixture
def counted(monkeypatch):
    """Count the built-in prompts generated; stop the run (as a test failure) long before a hang would end."""
    made = {"rows": 0}
    real = dict(C._GENERATORS)

    def counting(task):
        def make(rng, n):
            made["rows"] += 1
            if made["rows"] > 20_000:
                raise AssertionError("20,000 built-in prompts generated: the ask was not bounded up front")
            return real[task](rng, n)
        return make

    monkeypatch.setattr(C, "_GENERATORS", {task: counting(task) for task in real})
    return made


@pytest.mark.parametrize("how", ["build -n", "build(rows=)", "recipe", "calib -n", "quantize --rows"])
def test_a_huge_row_count_is_refused_up_front(tmp_path, monkeypatch, counted, how):
    monkeypatch.chdir(tmp_path)
    if how == "build -n":
        one_error_line(run_cli("build", "--no-wheels", "-n", 10**8, "-o", tmp_path / "b.tar.gz"),
                       "100000000 calibration rows (build --rows)", "would not fit in one calibration file")
    elif how == "build(rows=)":
        with pytest.raises(ConfigError, match="would not fit in one calibration file"):
            build_bundle(tmp_path / "b.tar.gz", wheels=False, rows=10**30)
    elif how == "recipe":
        recipe = tmp_path / "many.toml"
        recipe.write_text('[quant]\nname = "many"\nbits = 4\ngroup_size = 128\nsym = true\n'
                          '[calibration]\nrows = 100000000\n')
        with pytest.raises(ConfigError, match=r"recipe many's \[calibration\]"):
            build_bundle(tmp_path / "b.tar.gz", wheels=False, recipe=str(recipe))
    elif how == "calib -n":
        from tiny_tokenizer import make_tiny_tokenizer

        tok = make_tiny_tokenizer(tmp_path / "tok")
        one_error_line(run_cli("calib", "--model-dir", tok, "-n", 10**8, "--max-len", 64), "would not fit")
    else:
        with pytest.raises(ConfigError, match="would not fit"):
            C.build_calibration(None, None, rows=10**8, max_len=64, seed=0)
    assert counted["rows"] <= C.SIZE_SAMPLE_ROWS and not (tmp_path / "b.tar.gz").exists()


def test_rows_near_the_cap_stop_at_the_cap_as_they_are_written(monkeypatch, counted):
    monkeypatch.setattr(C, "MAX_CALIB_BYTES", 64 * 1024)  # the 256 MiB cap, scaled down
    # 200 rows fit the count bound (64 KiB / 256 B = 256 rows) and are too few to estimate: the cap decides
    with pytest.raises(ConfigError, match="they pass the 0 MiB"):
        C.builtin_calibration_text(200, 0, 2048)
    assert counted["rows"] < 200  # stopped at the cap, not after the ask
    assert len(C.builtin_calibration_text(20, 0, 64).encode()) <= 64 * 1024  # what fits is written


def test_every_builtin_row_is_longer_than_the_floor_the_bound_assumes():
    for seed in range(3):
        for max_len in (8, 64, 2048):
            rows = C.builtin_prompts(500, seed, max_words=C.builtin_max_words(max_len))
            shortest = min(len(json.dumps(r, ensure_ascii=False).encode()) + 1 for r in rows)
            assert shortest > C.MIN_BUILTIN_ROW_BYTES, (seed, max_len, shortest)
    # what the bound was written against, unchanged
    text = C.builtin_calibration_text(5, 0, 64)
    assert text == "\n".join(json.dumps(r, ensure_ascii=False) for r in C.builtin_prompts(5, 0, max_words=57)) + "\n"


# -- tracebacks: a deep-nested TOML recipe ------------------------------------------------------------------------

DEEP_TOML = {
    "arrays": '[quant]\nname = "deep"\nbits = 4\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n",
    "inline-tables": '[quant]\nname = "deep"\nx = ' + "{a = " * 100_000 + "1" + "}" * 100_000 + "\n",
    # a dotted key of N parts costs the parser O(N^2) memory: 3,000 parts parse (slowly) on 9ef8388, 100,000 do not
    "dotted-key": '[quant]\nname = "deep"\n' + "a" + ".a" * 3_000 + " = 1\n",
    "dotted-header": "[quant" + ".a" * 3_000 + "]\nx = 1\n",
}


@pytest.mark.parametrize("shape", sorted(DEEP_TOML))
def test_a_deep_nested_recipe_is_one_error_line(tmp_path, shape):
    from soarpack.recipe.model import load_recipe

    recipe = tmp_path / "deep.toml"
    recipe.write_text(DEEP_TOML[shape])
    with pytest.raises(ConfigError, match="not valid TOML .*nested more than 64 levels"):
        load_recipe(str(recipe))
    one_error_line(run_cli("recipes", recipe), "deep.toml", "nested more than 64 levels")
    one_error_line(run_cli("args", recipe), "deep.toml")  # as a profile


def test_the_depth_bound_leaves_every_packaged_toml_and_usual_syntax_alone():
    from soarpack import _toml

    for path in sorted((ROOT / "soarpack").rglob("*.toml")) + [ROOT / "pyproject.toml"]:
        text = path.read_text(encoding="utf-8")
        assert _toml.nesting_depth(text) <= 8, path
        _toml.loads(text)
    usual = ('a.b.c = 1\n[t]\nx = [1.5, 2.5, {y.z = "a.b[c]"}]  # [[ not a table\n[[u.v]]\n'
             'w = """x.y\n[z]"""\nq = \'lit.[\'\n')
    assert _toml.loads(usual)["t"]["x"][2] == {"y": {"z": "a.b[c]"}}
    nested = "x = " + "[" * 60 + "]" * 60
    assert _toml.loads(nested)  # 60 levels: within the bound
    with pytest.raises(_toml.TOMLDecodeError) as err:
        _toml.loads("x = [1,")  # the parser's own message for bad TOML, through the same error class
    assert str(err.value) and "nested" not in str(err.value)


# -- row counting: .ndjson and .JSONL ----------------------------------------------------------------------------

ROWS = "".join(json.dumps({"task": t, "text": f"row {i} " + "word " * 30}) + "\n"
               for i, t in enumerate(("niah", "qa", "mcq")))


@pytest.mark.parametrize("name", ["cal.ndjson", "cal.JSONL", "cal.NDJSON", "cal.txt"])
def test_calibration_rows_are_counted_by_one_rule(tmp_path, name):
    from soarpack.quant.calibinfo import file_rows

    path = tmp_path / name
    path.write_text(ROWS)  # JSONL content: a .txt is JSONL by its first line
    read = len(C.read_examples(path))
    assert read == 3
    assert file_rows(path)["rows"] == C.count_rows(name, ROWS) == read  # calib's and build's record
    assert file_rows(path)["tasks"] == {"mcq": 1, "niah": 1, "qa": 1}


@pytest.mark.needs_torch
@pytest.mark.parametrize("name", ["cal.ndjson", "cal.JSONL"])
def test_quantize_reports_the_rows_it_read_by_the_same_rule(tmp_path, name):
    from soarpack.quant.run import calibration_origin

    path = tmp_path / name
    path.write_text(ROWS)
    assert calibration_origin([path], 3, 3, "cli")["sources"][0]["rows"] == 3  # quantize's report


def test_build_of_a_ndjson_file_with_every_row_asked_carries_no_false_calib_short(tmp_path):
    path = tmp_path / "cal.ndjson"
    path.write_text(ROWS)
    built = build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[path], rows=3)
    record = built.manifest["quantize"]["calibration"]
    assert record["sources"][0]["rows"] == 3 and record["rows_asked"] == 3
    assert "calib-short" not in [r.name for r in built.risks], [r.line() for r in built.risks]
    from soarpack.bundle.summary import inspect_bundle

    assert inspect_bundle(built.path)["calibration"]["rows"] == 3


# -- a full disk --------------------------------------------------------------------------------------------------


def _enospc(*_args, **_kw):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_sglang_apply_on_a_full_disk_is_one_error_line(tmp_path, monkeypatch):
    from test_serve_patches import write_anchor_tree
    from soarpack.serve import patches as P

    tree = write_anchor_tree(tmp_path / "fork")
    copied = {"n": 0}
    real = shutil.copyfile

    def fills_up(src, dst, *a, **kw):  # the third file finds the disk full (copytree collects it into shutil.Error)
        copied["n"] += 1
        return _enospc() if copied["n"] >= 3 else real(src, dst, *a, **kw)

    monkeypatch.setattr(shutil, "copyfile", fills_up)
    monkeypatch.setattr(P, "_compile_check", lambda text, rel: None)  # the anchor tree holds fragments
    with pytest.raises(SoarpackError, match="no space left on the device"):
        P.apply_patches(tree, tmp_path / "out", verify_compile=False)
    copied["n"] = 0
    result = run_cli("sglang", "apply", "--sglang-src", tree, "-o", tmp_path / "out")
    one_error_line(result, "no space left on the device while writing", "nothing was replaced")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))


def test_quantize_log_on_a_full_disk_is_one_error_line(tiny_model_dir, tmp_path, monkeypatch):
    from soarpack.quant import logfile as R

    real = R.LogFile._write

    def full_from_calibration(self, text):  # the log's device fills up once the calibration phase starts
        if text.startswith("calibration ..."):
            _enospc()
        return real(self, text)

    monkeypatch.setattr(R.LogFile, "_write", full_from_calibration)
    log = tmp_path / "q.log"
    result = run_cli("quantize", tiny_model_dir, tmp_path / "q", "--log", log, "--rows", 8, "--max-len", 64)
    one_error_line(result, "no space left on the device after check", f"the log {log} is incomplete")
    assert not (tmp_path / "q").exists() and "check ..." in log.read_text()  # the work had begun: the log stays
    # refused in the check phase (the first line the log takes), the run did no work: no log is left behind
    monkeypatch.setattr(R.LogFile, "_write", lambda self, text: _enospc())
    result = run_cli("quantize", tiny_model_dir, tmp_path / "q", "--log", tmp_path / "q2.log", "--rows", 8)
    one_error_line(result, "no space left on the device")
    assert "incomplete" not in result.output and not (tmp_path / "q2.log").exists()


def test_quantize_into_the_current_folder_is_refused_before_any_work(tiny_model_dir, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    (here / "notes.txt").write_text("mine\n")
    monkeypatch.chdir(here)
    for out in (".", "./", str(here), ".."):
        result = run_cli("quantize", tiny_model_dir, out, "--force", "--rows", 8, "--max-len", 64)
        one_error_line(result, "the current folder", "renamed into place")
    assert (here / "notes.txt").read_text() == "mine\n" and sorted(os.listdir(tmp_path)) == ["here"]


# -- check with no BUNDLE ----------------------------------------------------------------------------------------


def _later_than(path: Path) -> None:
    """Wait until the file clock has moved past `path`'s times (they are coarse): a condition, not a delay."""
    st = os.stat(path)
    assert _wait_for(lambda: time.time() > st.st_ctime + 0.05)


def test_check_refuses_to_guess_when_an_older_bundle_has_a_future_mtime(tmp_path, monkeypatch):
    old, new = tmp_path / "soarpack-safe-w4-mlp-aaaaaaaa.tar.gz", tmp_path / "soarpack-safe-w4-mlp-bbbbbbbb.tar.gz"
    old.write_bytes(b"old")
    future = time.time() + 86400
    os.utime(old, (future, future))  # unpacked from an archive made where the clock ran a day ahead, say
    _later_than(old)
    new.write_bytes(b"new")  # then the new one is built
    with pytest.raises(ConfigError, match="which is newest is unclear") as err:
        newest_bundle(tmp_path)
    assert "modification time in the future" in err.value.message and old.name in err.value.message
    monkeypatch.chdir(tmp_path)
    one_error_line(run_cli("check", "--no-rehearse"), "which is newest is unclear", "pass BUNDLE")


def test_check_still_takes_the_bundle_written_last_when_the_times_agree(tmp_path):
    old, new = tmp_path / "soarpack-a.tar.gz", tmp_path / "soarpack-b.tar.gz"
    old.write_bytes(b"old")
    _later_than(old)
    new.write_bytes(b"new")
    assert newest_bundle(tmp_path) == new
    _later_than(new)
    os.utime(old, (time.time() - 3600, time.time() - 3600))  # older by its mtime, changed last by its ctime
    with pytest.raises(ConfigError, match="was modified last but"):
        newest_bundle(tmp_path)
    old.unlink()
    assert newest_bundle(tmp_path) == new
