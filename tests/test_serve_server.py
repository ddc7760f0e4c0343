"""`soarpack rehearse-server` against a stand-in `sglang` package whose launch_server serves soarpack.serve.fake_server.

Only the orchestration is tested here (start, health wait, eval, bench, score, stop, log); the real server needs a
GPU and the fork installed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.errors import ConfigError
from soarpack.rehearse import server as R
from soarpack.serve import server as S
from soarpack.steps import FAIL, PASS, SKIP

TESTS = Path(__file__).resolve().parent
LAUNCH_SERVER = '''
import argparse, json, os, signal, sys, threading, time
from soarpack.serve.fake_server import ChatReply, FakeSGLang

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--model-path", required=True)
args, _ = parser.parse_known_args()
print("argv " + json.dumps(sys.argv[1:]), flush=True)
mode = os.environ["FAKE_SGLANG_MODE"]
if mode == "die":
    print("Loading safetensors checkpoint shards", flush=True)
    print("KeyError: 'model.layers.0.mlp.extra_proj.weight'", flush=True)
    sys.exit(3)
if os.environ.get("FAKE_SGLANG_PIDFILE"):
    open(os.environ["FAKE_SGLANG_PIDFILE"], "w").write(str(os.getpid()))
if mode == "never":
    while True:
        time.sleep(0.1)
answers = json.load(open(os.environ["FAKE_SGLANG_ANSWERS"]))
server = FakeSGLang(port=args.port, chat=lambda q: ChatReply(answers.get(q, "no idea"))).start()
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: stop.set())
stop.wait()
server.stop()
print("clean shutdown", flush=True)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def standin_env(tmp_path):
    pkg = tmp_path / "standin" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pkg.parent), str(TESTS.parent)])  # soarpack of this checkout
    return env


@pytest.fixture
def public_set(tmp_path):
    """Three rows per task; the stand-in answers all correctly but one mcq row."""
    rows, answers = [], {}
    for task in ("mcq", "niah", "qa", "fwe", "cwe"):
        for k in range(3):
            question = f"{task} question {k}"
            gold = "B" if task == "mcq" else [f"needle-{task}-{k}"]
            rows.append({"task": task, "question": question, "gold": gold})
            answers[question] = "<think>hm</think>ANSWER: B" if task == "mcq" else f"</think>it is needle-{task}-{k}"
    answers["mcq question 0"] = "</think>ANSWER: C"
    data = tmp_path / "public.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    return data, tmp_path / "answers.json"


def test_launch_command_is_the_platforms():
    cmd = S.launch_command("/m", ["--quantization", "gptq_marlin"], 30000, python="py")
    assert cmd == ["py", "-m", "sglang.launch_server", "--model-path", "/m", "--trust-remote-code", "--port", "30000",
                   "--quantization", "gptq_marlin", "--tp-size", "1", "--max-running-requests", "32", "--enable-metrics"]


def test_gate_margin_is_measured_from_the_79_2_cliff():
    from soarpack.measure.scoring import full_credit_ori, gate_line

    assert full_credit_ori() == 79.2
    assert "expected C = 1.0" in gate_line(80.0, 100) and "margin +0.80 points" in gate_line(80.0, 100)
    assert "expected C = 0.96" in gate_line(79.0, 100) and "margin -0.20 points" in gate_line(79.0, 100)


def test_stratified_slice_takes_the_first_rows_of_each_task():
    rows = [{"task": t, "i": i} for i in range(4) for t in ("a", "b")]
    assert [(r["task"], r["i"]) for r in S.stratified_slice(rows, 2)] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]


@pytest.mark.slow
def test_ready_server_is_evaluated_benched_scored_and_stopped(tiny_model_dir, public_set, standin_env, tmp_path):
    data, answers = public_set
    env = dict(standin_env, FAKE_SGLANG_MODE="ready", FAKE_SGLANG_ANSWERS=str(answers))
    lines = []
    result = R.rehearse_server(tiny_model_dir, "safe", data, tmp_path / "out", port=_free_port(), per_task=2,
                               bench_rows=2, ready_timeout_s=60, env=env, on_event=lambda e: lines.append(e.message))
    assert result.eval["scored"] == 10 and result.eval["ori_accuracy"] == 90.0
    assert result.ok and "expected C = 1.0" in result.gate and "margin +10.80 points to the 79.2 cliff" in result.gate
    assert set(result.bench["tiers"]) == {"s1", "s8", "smax"} and not any(t["failed"] for t in result.bench["tiers"].values())
    assert result.score["c_factor"] == 1.0 and (tmp_path / "out" / "score.json").is_file()
    log = result.log_path.read_text()
    argv = json.loads(log.splitlines()[0][len("argv "):])
    assert argv[:4] == ["--model-path", str(tiny_model_dir), "--trust-remote-code", "--port"]
    assert argv[-5:] == ["--tp-size", "1", "--max-running-requests", "32", "--enable-metrics"]
    assert "clean shutdown" in log and result.exit_code == 0  # SIGTERM, then a clean exit; the log is kept
    assert any("server healthy" in line for line in lines)
    assert result.report.status() == {"server start": PASS, "eval": PASS, "bench": PASS, "server stop": PASS, "score": PASS}
    assert result.report["score"].data["c_factor"] == 1.0 and result.report["eval"].data["scored"] == 10
    assert result.report["server stop"].data["exit_code"] == 0


def test_max_tokens_caps_the_eval_and_the_bench_and_says_the_accuracy_is_not_the_platforms(
        tiny_model_dir, public_set, standin_env, tmp_path):
    data, answers = public_set
    env = dict(standin_env, FAKE_SGLANG_MODE="ready", FAKE_SGLANG_ANSWERS=str(answers))
    out = tmp_path / "out"
    result = R.rehearse_server(tiny_model_dir, "safe", data, out, port=_free_port(), per_task=1, bench_rows=2,
                               ready_timeout_s=60, max_tokens=8, env=env)
    assert result.report.status()["eval"] == PASS and result.report.status()["bench"] == PASS
    rows = json.loads((out / "eval.json").read_text())["rows"]
    assert rows and {r["key"]["max_tokens"] for r in rows} == {8}
    assert result.report["eval"].data["max_tokens"] == 8
    # the verdict line itself carries it, not only the eval step
    assert result.gate.endswith("(answers cut at 8 tokens by --max-tokens: not the platform's accuracy)"), result.gate
    assert "answers cut at 8 tokens" in result.report["eval"].detail and "not the platform's accuracy" in \
        result.report["eval"].detail
    from soarpack.measure.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    speed = [json.loads(line) for line in (out / "speed-short.jsonl").read_text().splitlines()]
    assert all(len(tok.encode(r["model_response"], add_special_tokens=False)) <= 8 for r in speed)
    with pytest.raises(ConfigError, match="--max-tokens"):
        R.rehearse_server(tiny_model_dir, "safe", data, tmp_path / "o2", max_tokens=0)


def test_a_server_that_dies_at_start_shows_its_last_log_lines(tiny_model_dir, public_set, standin_env, tmp_path):
    data, _ = public_set
    env = dict(standin_env, FAKE_SGLANG_MODE="die")
    result = R.rehearse_server(tiny_model_dir, "safe", data, tmp_path / "out", port=_free_port(), per_task=1,
                               bench_rows=1, ready_timeout_s=60, env=env)
    start = result.report["server start"]
    assert start.status == FAIL and not result.ok
    assert "exited with code 3" in start.detail and "KeyError: 'model.layers.0.mlp.extra_proj.weight'" in start.detail
    assert "\n" not in start.detail and (tmp_path / "out" / "server.log").is_file()
    # every later step needs the server: skipped, each naming it
    assert {r.name: (r.status, r.data["cause"]) for r in result.report.steps[1:]} == {
        name: (SKIP, "server start") for name in ("eval", "bench", "server stop", "score")}


def test_a_server_never_healthy_times_out_and_is_stopped(standin_env, tmp_path):
    env = dict(standin_env, FAKE_SGLANG_MODE="never")
    lines = []
    cmd = S.launch_command(tmp_path, [], _free_port())
    with pytest.raises(S.ServerError, match="not healthy after 2 s"):
        S.start_server(cmd, int(cmd[cmd.index("--port") + 1]), tmp_path / "server.log", timeout_s=2.0, env=env,
                       on_event=lambda e: lines.append(e.message), poll_s=0.2)
    assert "argv" in (tmp_path / "server.log").read_text()


def test_a_port_that_already_answers_is_refused_before_anything_starts(standin_env, tmp_path):
    # On the device a server an earlier call left on the port answered /health at once, and the "rehearsal" measured it.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(S.ServerError, match=f"port {port} on 127.0.0.1 already accepts connections") as err:
            S.start_server(S.launch_command(tmp_path, [], port), port, tmp_path / "server.log", timeout_s=5,
                           env=dict(standin_env, FAKE_SGLANG_MODE="ready"))
    assert "--port" in err.value.hint and not (tmp_path / "server.log").exists()  # nothing was started


REHEARSE_THEN_WAIT = """
import sys
from soarpack.rehearse import server as R
ckpt, data, out, port = sys.argv[1:5]
R.rehearse_server(ckpt, "safe", data, out, port=int(port), per_task=1, bench_rows=1, ready_timeout_s=120)
"""


def test_sigterm_while_the_server_starts_stops_the_server_too(tiny_model_dir, public_set, standin_env, tmp_path):
    # Python's default SIGTERM would end soarpack and leave the server (its own session) holding the GPU.
    data, _ = public_set
    pidfile = tmp_path / "server.pid"
    env = dict(standin_env, FAKE_SGLANG_MODE="never", FAKE_SGLANG_PIDFILE=str(pidfile))
    proc = subprocess.Popen([sys.executable, "-c", REHEARSE_THEN_WAIT, str(tiny_model_dir), str(data),
                             str(tmp_path / "out"), str(_free_port())], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.is_file() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        server_pid = int(pidfile.read_text())
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(ProcessLookupError):  # stopped and reaped by soarpack before it exited
        os.kill(server_pid, 0)


def test_progress_lines_while_waiting(standin_env, tmp_path, monkeypatch):
    # every poll says where the wait stands: the first one comes long before the 1.6 s timeout, whatever the load
    monkeypatch.setattr(S, "PROGRESS_EVERY_S", 0.0)
    env = dict(standin_env, FAKE_SGLANG_MODE="never")
    lines = []
    cmd = S.launch_command(tmp_path, [], _free_port())
    with pytest.raises(S.ServerError):
        S.start_server(cmd, int(cmd[cmd.index("--port") + 1]), tmp_path / "server.log", timeout_s=1.6, env=env,
                       on_event=lambda e: lines.append(e.message), poll_s=0.2)
    assert any(line.startswith("waiting for the server on http://127.0.0.1:") for line in lines)


def test_cli_refuses_a_missing_model_dir(tmp_path):
    (tmp_path / "d.jsonl").write_text("")
    res = CliRunner().invoke(app, ["rehearse-server", str(tmp_path / "nope"), "--data", str(tmp_path / "d.jsonl")])
    assert res.exit_code == 2 and "no config.json" in " ".join(res.output.split())


@pytest.mark.slow
def test_cli_json_carries_every_step(tiny_model_dir, public_set, standin_env, tmp_path):
    data, answers = public_set
    env = {k: v for k, v in standin_env.items() if os.environ.get(k) != v}
    env.update(FAKE_SGLANG_MODE="ready", FAKE_SGLANG_ANSWERS=str(answers))
    args = ["rehearse-server", str(tiny_model_dir), "--data", str(data), "--per-task", "1", "--bench-rows", "1",
            "--ready-timeout", "60"]
    res = CliRunner().invoke(app, ["--format", "json", *args, "--port", str(_free_port()), "-o", str(tmp_path / "a")],
                             env=env)
    alias = CliRunner().invoke(app, [*args, "--port", str(_free_port()), "-o", str(tmp_path / "b"), "--json"], env=env)
    assert res.exit_code == alias.exit_code == 0, res.output
    got, again = json.loads(res.stdout), json.loads(alias.stdout)
    assert [s["name"] for s in got["steps"]] == ["server start", "eval", "bench", "server stop", "score"]
    assert {s["status"] for s in got["steps"]} == {PASS} and got["ok"] and got["score"]["c_factor"] == 1.0
    assert [s["name"] for s in again["steps"]] == [s["name"] for s in got["steps"]] and again["gate"] == got["gate"]
