"""Issue 39, diagnose: it says what it did not read (a long log's start, files past the cap), a warning that quotes a
signature is not taken for the cause, an unverified pattern on a plain line makes no verdict, malformed results
are not healthy, a FIFO or a device never blocks or exhausts memory, and deep JSON is one error line."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.measure.evaluate import EVAL_KIND
from soarpack.measure.speed import BENCH_KIND
from soarpack.cli import app
from soarpack.diagnosis import diagnose, diagnose_text, inputs
from under_test import SOARPACK_ROOT

runner = CliRunner()
CPU_WORKERS = "ValueError: Virtual pool 'model_loader:cpu' requests 2 workers but parent 'cpu' only has 1"


def _cli(*args):
    return runner.invoke(app, ["diagnose", *map(str, args)])


def _child(*args, timeout=120, memory=None):
    def limit():
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SOARPACK_ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "soarpack", "diagnose", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, preexec_fn=limit)


def test_a_log_longer_than_the_read_says_which_part_was_read(tmp_path, monkeypatch):
    """The failure is in the part not read: the report must say so (the 32 MiB cap is shrunk to 1 MiB here)."""
    monkeypatch.setattr(inputs, "MAX_READ_BYTES", 1 << 20)
    log = tmp_path / "quantize.log"
    with log.open("w") as fh:
        fh.write(CPU_WORKERS + "\n")  # the failure, at the start
        line = "INFO quantizing layer, all is well " * 3 + "\n"
        fh.write(line * (2 * 2**20 // len(line)))
    res = _cli(log)
    assert "not read:" in res.output and "in the part read" in res.output, res.output
    d = diagnose([log])
    assert d.inputs[0].truncated and d.inputs[0].read_from > 0
    assert any("only its last 1 MiB were read" in n and "is not seen" in n for n in d.notes), d.notes
    res = runner.invoke(app, ["diagnose", "--json", str(log)])
    assert json.loads(res.output)["notes"] == d.notes


def test_a_folder_past_the_file_cap_says_where_it_stopped(tmp_path, monkeypatch):
    for i in range(inputs.MAX_FILES + 3):
        (tmp_path / f"run{i:04d}.log").write_text("INFO fine\n")
    res = _cli(tmp_path)
    assert "not read:" in res.output and f"stopped after {inputs.MAX_FILES} files" in res.output, res.output[-500:]
    d = diagnose([tmp_path])
    assert len(d.inputs) == inputs.MAX_FILES
    assert any(f"stopped after {inputs.MAX_FILES} files" in n for n in d.notes), d.notes


def test_a_warning_quoting_a_signature_is_not_the_cause_and_the_real_error_shows():
    text = ("WARNING retry: got \"Virtual pool 'x' requests 2 workers but parent 'cpu' only has 1\", retrying with 1\n"
            "INFO retried\n"
            "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    d = diagnose_text(text, kind="quantize")
    assert d.exit_code == 0
    (x,) = d.excerpts
    assert x.first_error and "illegal memory access" in x.first_error  # the real error, not the warning
    (f,) = [f for f in d.findings if f.entry_id == "gptqmodel-cpu-workers"]
    assert f.quoted_in_warning and not d.confirmed(f)


def test_a_real_error_line_ranks_above_a_warning_quoting_it():
    text = f"WARNING: earlier run said {CPU_WORKERS}\nINFO ...\n{CPU_WORKERS}\n"
    d = diagnose_text(text, kind="quantize")
    (f,) = [f for f in d.findings if f.entry_id == "gptqmodel-cpu-workers"]
    assert f.where.startswith("line 3") and d.exit_code == 1  # the error line is quoted, not the warning
    assert d.confirmed(f)


def test_an_unverified_pattern_on_a_successful_logs_retry_line_makes_no_verdict(tmp_path):
    log = tmp_path / "platform.log"
    log.write_text("starting sglang\nserver not ready yet, retrying in 5 s\nserver is up, 200 OK\neval done: 150 rows\n")
    d = diagnose([log])
    assert "platform-server-timeout" in {f.entry_id for f in d.findings}
    assert d.exit_code == 0
    res = _cli(log)
    assert res.exit_code == 0 and "NOT A VERDICT" in res.output, res.output


GOOD_ROW = {"index": 0, "task": "qa", "prediction": "</think>x", "output_tokens": 3, "error": None}


@pytest.mark.parametrize("doc, said", [
    ({"kind": EVAL_KIND, "rows": "oops"}, "not a list"),
    ({"kind": EVAL_KIND, "rows": [1, 2]}, "not a record"),
    ({"kind": EVAL_KIND, "rows": []}, "holds no rows"),
    ({"kind": EVAL_KIND}, "rows missing"),
    ({"kind": EVAL_KIND, "rows": [{**GOOD_ROW, "prediction": 5}]}, "prediction 5"),
    ({"kind": EVAL_KIND, "rows": [{**GOOD_ROW, "output_tokens": "many"}]}, "output_tokens 'many'"),
    ({"kind": EVAL_KIND, "rows": [GOOD_ROW], "max_tokens": "big"}, "max_tokens 'big'"),
    ({"kind": BENCH_KIND, "tiers": {"s1": {"failed": "x", "num_requests": 4}}}, "failed 'x'"),
    ({"kind": BENCH_KIND, "tiers": []}, "no tiers"),
    ({"kind": BENCH_KIND, "tiers": {"s1": [1]}}, "not a record"),
], ids=["rows-str", "rows-ints", "no-rows", "rows-missing", "prediction-int", "tokens-str", "max-tokens", "failed-str",
        "tiers-list", "tier-list"])
def test_malformed_results_are_not_healthy(tmp_path, doc, said):
    path = tmp_path / "result.json"
    path.write_text(json.dumps(doc))
    res = _cli(path)
    assert res.exit_code == 1, res.output
    assert "result-malformed" in res.output and said in res.output and "Traceback" not in res.output


def test_a_well_formed_result_is_still_healthy(tmp_path):
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"kind": EVAL_KIND, "rows": [GOOD_ROW], "max_tokens": 16}))
    assert _cli(path).exit_code == 0


def test_a_fifo_with_no_writer_does_not_block(tmp_path):
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    proc = _child(fifo)  # blocked forever before: open() of a FIFO waits for a writer
    assert proc.returncode == 0, proc.stderr
    assert "a pipe that gave nothing to read" in proc.stdout


def test_a_pipe_with_a_writer_is_read(tmp_path):
    proc = subprocess.run(["bash", "-c", f'{sys.executable} -m soarpack diagnose <(printf "%s\\n" "$1")', "x",
                           CPU_WORKERS], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=SOARPACK_ROOT))
    assert proc.returncode == 1 and "gptqmodel-cpu-workers" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["zero.log", "zero.json"])
def test_dev_zero_through_a_symlink_is_refused_in_bounded_memory(tmp_path, name):
    link = tmp_path / name
    os.symlink("/dev/zero", link)
    proc = _child(link, memory=1536 * 2**20)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "is a character device, not a log file" in proc.stderr and "Traceback" not in proc.stderr


def test_many_large_logs_are_read_one_at_a_time(tmp_path, monkeypatch):
    """120 logs each past the read cap: memory holds one, not all (the cap is shrunk to 256 KiB to keep it small:
    all 120 tails are 30 MiB, one is 256 KiB)."""
    monkeypatch.setattr(inputs, "MAX_READ_BYTES", 256 << 10)
    one = tmp_path / "one.txt"
    line = "INFO " + "x" * 1000 + "\n"
    one.write_text(line * ((384 << 10) // len(line)))  # 384 KiB: read from its end
    folder = tmp_path / "logs"
    folder.mkdir()
    for i in range(120):
        os.link(one, folder / f"run{i:03d}.log")
    tracemalloc.start()
    try:
        d = diagnose([folder])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(d.inputs) == 120 and all(i.truncated for i in d.inputs)
    assert peak < 12 * 2**20, f"peak {peak / 2**20:.0f} MiB: every file's tail was held at once"


def test_deep_nested_json_in_a_result_is_one_error_line(tmp_path):
    depth = 100_000
    path = tmp_path / "eval.json"
    path.write_text('{"kind": "%s", "rows": ' % EVAL_KIND + "[" * depth + "]" * depth + "}")
    res = _cli(path)
    assert res.exit_code == 2 and "nested too deep" in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    (tmp_path / "run.log").write_text("INFO fine\n")
    d = diagnose([tmp_path])  # in a folder: skipped, and said
    assert any("nested too deep" in n for n in d.notes)
