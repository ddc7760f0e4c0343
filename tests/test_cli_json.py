"""The global `--format json` on every command that prints a result, the same as the command's own `--json`:
stdout holds exactly one JSON document, and nothing else. (quantize and verify: tests/test_quant_e2e.py; compare:
tests/test_bench_compare.py; rehearse-server against a stand-in server: tests/test_serve_server.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import ChatReply, FakeSGLang, GenerateScript
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.cli import app

runner = CliRunner()


def _both(args, cwd_args=None):
    """The result as `soarpack --format json ARGS` and as `soarpack ARGS --json` (cwd_args: other args for the 2nd)."""
    first = runner.invoke(app, ["--format", "json", *args])
    second = runner.invoke(app, [*(cwd_args or args), "--json"])
    assert first.exit_code == second.exit_code, (first.output, second.output)
    return json.loads(first.stdout), json.loads(second.stdout), first


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "model")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("json") / "b.tar.gz"
    res = runner.invoke(app, ["build", "--no-wheels", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_profiles_args_and_the_patch_list():
    a, b, _ = _both(["profiles"])
    assert a == b and "safe" in {p["name"] for p in a}
    a, b, _ = _both(["args", "safe"])
    assert a == b and a["name"] == "safe" and isinstance(a["findings"], list)
    a, b, _ = _both(["sglang", "list"])
    assert a == b and all({"name", "file", "concern", "files"} <= set(p) for p in a)


def test_build_inspect_and_check(bundle, tmp_path):
    a, b, res = _both(["build", "--no-wheels", "-o", str(tmp_path / "x.tar.gz")],
                      ["build", "--no-wheels", "-o", str(tmp_path / "y.tar.gz")])
    assert res.stderr == ""  # the --no-wheels warning is in the JSON, not on stderr
    assert any("--no-wheels" in w for w in a["warnings"])
    assert a["path"] == str(tmp_path / "x.tar.gz") and b["path"] == str(tmp_path / "y.tar.gz")
    assert a["manifest"] == b["manifest"] and a["manifest"]["profile"]["name"] == "fast-gla"
    a, b, _ = _both(["inspect", str(bundle)])
    assert a == b and a["path"] == str(bundle) and a["sha256"]
    a, b, res = _both(["check", str(bundle), "--no-rehearse"])
    assert res.exit_code == 1 and a["gate"] == b["gate"] and a["steps"][0]["name"] == "size"


@pytest.mark.needs_torch  # tiny-model writes weights with torch
def test_tiny_model_calib_and_speedset(tmp_path, tokenizer_dir):
    a, b, _ = _both(["tiny-model", str(tmp_path / "t1"), "--layers", "2"], ["tiny-model", str(tmp_path / "t2"), "--layers", "2"])
    assert a["mixer_types"] == b["mixer_types"] and a["path"] == str(tmp_path / "t1")
    a, b, _ = _both(["calib", "--model-dir", str(tmp_path / "t1"), "--rows", "4", "--max-len", "64"])
    assert a == b and a["rows"] == 4
    a, b, _ = _both(["speedset", "--model-dir", tokenizer_dir, "-n", "3", "-o", str(tmp_path / "s1.jsonl")],
                    ["speedset", "--model-dir", tokenizer_dir, "-n", "3", "-o", str(tmp_path / "s2.jsonl")])
    assert a["rows"] == b["rows"] == 3 and a["histogram"] == b["histogram"]


def test_eval_bench_and_score(tmp_path, tokenizer_dir):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task": "qa", "question": f"q{i}", "gold": ["x"]}) + "\n" for i in range(3)))
    speed = tmp_path / "s.jsonl"
    speed.write_text("".join(json.dumps({"question": f"row {i} the river", "model_response": "tok tok tok"}) + "\n"
                             for i in range(3)))
    with FakeSGLang(chat=lambda q: ChatReply("</think>x"), generate=GenerateScript(ttft_s=0.01, token_delay_s=0.001)) as server:
        a, b, _ = _both(["eval", "--api-base", server.url, "--data", str(data), "-o", str(tmp_path / "e1.json")],
                        ["eval", "--api-base", server.url, "--data", str(data), "-o", str(tmp_path / "e2.json")])
        assert a["ori_accuracy"] == b["ori_accuracy"] == 100.0 and "rows" not in a
        bench_args = ["bench", "--api-base", server.url, "--s1", str(speed), "--s8", str(speed), "--smax", str(speed),
                      "--model-dir", tokenizer_dir, "--settle", "0"]
        a, b, _ = _both([*bench_args, "-o", str(tmp_path / "b1.json")], [*bench_args, "-o", str(tmp_path / "b2.json")])
        assert set(a["tiers"]) == set(b["tiers"]) == {"s1", "s8", "smax"}
    a, b, _ = _both(["score", "--ours", str(tmp_path / "b1.json"), "--eval", str(tmp_path / "e1.json"),
                     "--best", str(tmp_path / "b1.json")])
    assert a == b and a["c_factor"] == 1.0 and a["final_score"] == 100.0


def test_serve_check(tmp_path, monkeypatch):
    from soarpack.serve import forkcheck as F

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    src = tmp_path / "fork" / "python"
    (src / "sglang").mkdir(parents=True)
    monkeypatch.setattr(F, "run_fork_check", lambda *a, **k: F.ForkCheckResult(True, "fork tree: pass", "table", []))
    a, b, _ = _both(["serve-check", str(ckpt), "--sglang-src", str(src)])
    assert a == b and a["ok"] and a["summary"] == "fork tree: pass"


def test_rehearse_server(tmp_path, monkeypatch):
    """Its steps, gate and score as one JSON document; the steps' progress stays off stdout (and off stderr)."""
    from soarpack.rehearse import server as R
    from soarpack.steps import Event, RunReport, StepResult

    def fake(ckpt, profile, data, out_dir, **kwargs):
        kwargs["on_event"](Event("info", "server start", "waiting for /health"))
        report = RunReport([StepResult("server start", "pass", seconds=1.5), StepResult("eval", "fail", "C = 0.92", 2.0)])
        return R.RehearsalResult(False, "eval failed", "gate: below", Path(out_dir), Path(out_dir) / "server.log",
                                 report, score={"final_score": 12.5})

    monkeypatch.setattr(R, "rehearse_server", fake)
    (tmp_path / "ckpt").mkdir()
    args = ["rehearse-server", str(tmp_path / "ckpt"), "--data", str(tmp_path / "d.jsonl"), "-o", str(tmp_path / "r")]
    a, b, res = _both(args)
    assert res.exit_code == 1 and res.stderr == ""
    assert a == b and a["ok"] is False and a["gate"] == "gate: below" and a["score"] == {"final_score": 12.5}
    assert [(s["name"], s["status"]) for s in a["steps"]] == [("server start", "pass"), ("eval", "fail")]


def test_wheels_fetch_and_lock(tmp_path, monkeypatch):
    from soarpack.bundle import wheels as W

    monkeypatch.setenv("SOARPACK_CACHE", str(tmp_path / "cache"))
    lock = W.load_lock()
    monkeypatch.setattr(W, "fetch_into_cache", lambda lock, cache, on_event: None)  # no network here
    a, b, _ = _both(["wheels", "fetch"])
    assert a == b and a["wheels"] == [w.spec for w in lock] and a["cache"].startswith(str(tmp_path / "cache"))
    monkeypatch.setattr(W, "resolve_lock", lambda on_event: W.LOCK_PATH)
    a, b, _ = _both(["wheels", "lock"])
    assert a == b and a["lock"] == str(W.LOCK_PATH) and len(a["wheels"]) == len(lock)


def test_quiet_and_verbose_exclude_each_other_everywhere():
    res = runner.invoke(app, ["-q", "-v", "profiles"])
    assert res.exit_code == 2 and "exclude each other" in res.output


def test_quiet_leaves_only_the_result_and_problems(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task": "qa", "question": f"q{i}", "gold": ["x"]}) + "\n" for i in range(3)))
    with FakeSGLang(chat=lambda q: ChatReply("</think>x")) as server:
        loud = runner.invoke(app, ["eval", "--api-base", server.url, "--data", str(data), "-o", str(tmp_path / "a.json")])
        quiet = runner.invoke(app, ["-q", "eval", "--api-base", server.url, "--data", str(data), "-o", str(tmp_path / "b.json")])
    assert loud.exit_code == quiet.exit_code == 0
    assert "wrote" in loud.stderr and "eval rows: 3/3" in loud.stderr
    assert "wrote" not in quiet.stderr and "eval rows" not in quiet.stderr and quiet.stdout == loud.stdout


def test_recipes_and_diagnose(tmp_path):
    a, b, _ = _both(["recipes"])
    assert a == b and {"w4-mlp", "w4-full", "w4-balanced"} <= {r["name"] for r in a}
    log = tmp_path / "prepare_env.log"
    log.write_text("ImportError: cannot import name 'ScalingType' from 'torch.nn.functional'\n")
    a, b, res = _both(["diagnose", str(log)])
    assert res.exit_code == 1 and a == b
    a, b, _ = _both(["diagnose", "--catalogue"])
    assert a == b and a


@pytest.mark.needs_torch  # the release shape comes from soarpack.sala.release (imports torch)
def test_kernels_with_the_stand_in_backend(monkeypatch):
    from soarpack.kernels import measure

    monkeypatch.setenv(measure.BACKEND_ENV, "kernels_standin:backend")
    a, b, _ = _both(["kernels", "--recipe", "w4-mlp", "--m", "1,8192"])
    assert a["rollup"] == b["rollup"] and a["dispatch_env"] == b["dispatch_env"]


def test_env_cache_and_fake_server(tmp_path, monkeypatch):
    """env, cache list, cache clear (a dry run) and fake-server (its address, then it is stopped)."""
    monkeypatch.setenv("SOARPACK_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    (tmp_path / "cache" / "wheels" / "x.whl").write_bytes(b"x" * 5000)
    a, b, _ = _both(["env", "--no-sizes"])
    assert a["versions"] == b["versions"] and a["cache"]["root"] == str(tmp_path / "cache")
    a, b, _ = _both(["cache", "list"])
    assert a["entries"] == b["entries"] and [e["name"] for e in a["entries"]] == ["wheels"]
    a, b, _ = _both(["cache", "clear"])
    assert a == b and a["dry_run"] is True and (tmp_path / "cache" / "wheels" / "x.whl").is_file()
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    docs = []
    for args in (["--format", "json", "fake-server", "--port", "0"], ["fake-server", "--port", "0", "--json"]):
        proc = subprocess.Popen([sys.executable, "-m", "soarpack", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=root)
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("}"):
                break
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)  # a bound for a loaded machine, not a speed
        assert proc.returncode == 0 and rest == "" and err == "", err
        docs.append(json.loads("".join(lines)))
    for doc in docs:
        assert doc["url"].startswith("http://127.0.0.1:") and doc["stand_in"] is True and doc["model_id"] == "fake-sala"
