"""Issue 39, the Python API: an `on_event` callback that prints reaches the caller's stdout (the run sends the
libraries' output to its log, not the callback's), and two `soarpack.quantize` calls from two threads leave
`sys.stdout`/`sys.stderr` as they found them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import soarpack
from under_test import SOARPACK_ROOT

SMALL = dict(recipe="w4-full", rows=4, max_len=32, device="cpu", no_report=True)
WAIT_S = 600  # a wait that times out fails the test rather than hanging it


@pytest.mark.slow
@pytest.mark.gptq
def test_an_on_event_callback_that_prints_reaches_stdout_not_the_log(tiny_model_dir, tmp_path, capsys):
    log = tmp_path / "run.log"
    soarpack.quantize(tiny_model_dir, tmp_path / "out", log=log, **SMALL,
                      on_event=lambda e: print(f"seen {e.kind} {e.phase}", file=sys.stderr if e.kind == "end"
                                               else sys.stdout))
    out, err = capsys.readouterr()
    assert "seen start check" in out and "seen start gptq" in out and "seen info done" in out, out
    assert "seen end check" in err and "seen end verify" in err, err
    assert "seen " not in log.read_text()  # the run's log holds its own lines and the libraries', not the caller's


@pytest.mark.slow
@pytest.mark.gptq
def test_a_printing_callback_reaches_the_processs_real_stdout(tiny_model_dir, tmp_path):
    """In a fresh interpreter stdout is file descriptor 1 itself, which the run points at its log (or nowhere)."""
    code = ("import sys, soarpack\n"
            f"soarpack.quantize({str(tiny_model_dir)!r}, {str(tmp_path / 'out')!r}, **{SMALL!r},\n"
            "                  on_event=lambda e: print('seen', e.kind, e.phase, flush=True))\n"
            "print('after the run', flush=True)\n")
    env = dict(os.environ, PYTHONPATH=SOARPACK_ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=WAIT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "seen start check" in lines and "seen end gptq" in lines and lines[-1] == "after the run", proc.stdout


@pytest.mark.slow
@pytest.mark.gptq
def test_two_quantize_threads_leave_sys_stdout_and_stderr_as_they_were(tiny_model_dir, tmp_path):
    """The first run to start finishes first while the second is still running: the order that left the second's
    exit restoring the first's closed log file as sys.stdout."""
    before = sys.stdout, sys.stderr
    first_in, second_in, first_done = threading.Event(), threading.Event(), threading.Event()
    errors = []

    def first_events(event):
        if event.kind == "start" and event.phase == "check":
            first_in.set()
        if event.kind == "start" and event.phase == "calibration":
            assert second_in.wait(WAIT_S)

    def second_events(event):
        if event.kind == "start" and event.phase == "check":
            second_in.set()
        if event.kind == "start" and event.phase == "calibration":
            assert first_done.wait(WAIT_S)

    def run(name, on_event, done=None):
        try:
            soarpack.quantize(tiny_model_dir, tmp_path / name, log=tmp_path / f"{name}.log", **SMALL,
                              on_event=on_event)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{name}: {exc!r}")
            second_in.set()
        finally:
            if done is not None:
                done.set()

    first = threading.Thread(target=run, args=("first", first_events, first_done))
    second = threading.Thread(target=run, args=("second", second_events))
    first.start()
    assert first_in.wait(WAIT_S)
    second.start()
    deadline = time.monotonic() + 2 * WAIT_S
    for t in (first, second):
        t.join(max(1.0, deadline - time.monotonic()))
    assert not first.is_alive() and not second.is_alive()
    after = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = before  # pytest's own streams back before anything can fail on a closed one
    assert errors == []
    assert after[0] is before[0] and after[1] is before[1], after
    assert not before[0].closed and not before[1].closed
    assert (tmp_path / "first" / "config.json").is_file() and (tmp_path / "second" / "config.json").is_file()


# -- the capture itself (soarpack.quant.capture), without a model ----------------------------------------------------


def test_overlapping_captures_share_one_redirect_and_the_last_restores_the_streams(tmp_path, capsys):
    from soarpack.quant.capture import caller_streams, library_output_to

    before = sys.stdout, sys.stderr
    fd1 = os.fstat(1)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first():
        with library_output_to(tmp_path / "first.log"):
            first_in.set()
            assert second_in.wait(60)
            print("first's library line")
        first_out.set()

    def second():
        assert first_in.wait(60)
        with library_output_to(tmp_path / "second.log"):
            second_in.set()
            assert first_out.wait(60)
            print("second's library line")  # after the first's log was closed
            with caller_streams():
                print("second's caller line")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    after = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = before
    assert after[0] is before[0] and after[1] is before[1]
    assert (os.fstat(1).st_ino, os.fstat(1).st_dev) == (fd1.st_ino, fd1.st_dev)  # fd 1 leads where it led
    assert "first's library line" in (tmp_path / "first.log").read_text()
    second_log = (tmp_path / "second.log").read_text()
    assert "second's library line" in second_log and "caller line" not in second_log
    assert capsys.readouterr().out == "second's caller line\n"
