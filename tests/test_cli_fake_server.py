"""`soarpack fake-server`: started through the CLI in its own process, eval and bench run against it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.serve.fake_server import made_up_reply
from tiny_tokenizer import make_tiny_tokenizer

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_server():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    # SIGINT as a terminal delivers it, also where the tests themselves run with it ignored (nohup, `&`: an ignored
    # signal is inherited, and Python then installs no KeyboardInterrupt handler).
    proc = subprocess.Popen([sys.executable, "-m", "soarpack", "fake-server", "--port", "0", "--ttft", "0.01",
                             "--token-delay", "0.0001"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else url
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def test_eval_and_bench_run_against_it_and_it_stops_on_ctrl_c(fake_server, tmp_path):
    proc, url = fake_server
    rows = [{"task": "mcq", "question": f"question {i}", "gold": "A"} for i in range(5)]
    data = tmp_path / "public.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = runner.invoke(app, ["eval", "--api-base", url, "--data", str(data), "-n", "3", "-o", str(tmp_path / "e.json")])
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["total"] == 3 and report["failed"] == 0, res.output
    # its answers are what made_up_reply says: the numbers come from made-up letters, nothing else
    want = [1.0 if made_up_reply(r["question"]).content.endswith("ANSWER: A") else 0.0 for r in rows[:3]]
    assert [r["score"] for r in report["rows"]] == want
    assert res.exit_code == (0 if report["c_factor"] >= 1 else 1), res.output

    tok = make_tiny_tokenizer(tmp_path / "tok")
    speed = tmp_path / "s1.jsonl"
    speed.write_text("".join(json.dumps({"question": f"row {i} the river", "model_response": "tok tok tok"}) + "\n"
                             for i in range(4)))
    res = runner.invoke(app, ["bench", "--api-base", url, "--model-dir", tok, "--s1", str(speed), "-n", "2",
                              "--settle", "0", "-o", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    bench = json.loads((tmp_path / "b.json").read_text())
    assert bench["tiers"]["s1"]["failed"] == 0 and bench["tiers"]["s1"]["completed"] == 2

    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)  # a bound for a loaded machine: it returns as soon as the server exits
    assert proc.returncode == 0, err
    assert "a stand-in, not SGLang" in err and "stopped after 3 chat and" in err


def test_a_port_in_use_is_one_error_line(fake_server):
    _, url = fake_server
    port = url.rsplit(":", 1)[1]
    res = runner.invoke(app, ["fake-server", "--port", port])
    assert res.exit_code == 2
    assert f"error: cannot listen on 127.0.0.1:{port}" in res.stderr and "--port 0" in res.stderr


def test_its_help_says_it_is_a_stand_in():
    text = " ".join(runner.invoke(app, ["fake-server", "-h"]).output.split())
    assert "A stand-in, not SGLang" in text and "made-up text" in text and "mean nothing" in text
