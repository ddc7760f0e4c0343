"""`soarpack --format json COMMAND`, for every command `soarpack --help` lists: stdout is exactly one JSON document,
and stderr holds progress lines only (no table, no note, no result or verdict line). A verdict (below the gate, an
incomplete run, not uploadable, a known failure) is in the JSON and in the exit code."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.serve.fake_server import ChatReply, FakeSGLang, GenerateScript
from tiny_tokenizer import make_tiny_tokenizer

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent

# What a progress line looks like: a phase starting ("running: X ...", "quantize: gptq ..."), ending ("... done in
# 3.0 s"), a count (the plain-text form of a progress bar: "eval rows: 3/3 after 0 s", "gptq layer 1/4"), or a
# step's pass/fail/skip line. Anything else on stderr (a table, a note, "wrote ...", a verdict) fails the test.
PROGRESS = re.compile(r"^(running: .+ \.\.\."
                      r"|[\w -]+: .* \.\.\."
                      r"|[\w -]+: .* done in [\d.]+ s"
                      r"|[\w .-]+: .*\b\d+/\d+\b.*"
                      r"|(pass|FAIL|skip) .+ s\b.*)$")


def leaf_commands():
    """Every command `soarpack --help` lists, groups expanded (`wheels fetch`): the list this test must cover."""
    import typer.main

    group = typer.main.get_command(app)
    names = []
    for name, cmd in group.commands.items():
        sub = getattr(cmd, "commands", None)
        names += [f"{name} {s}" for s in sub] if sub else [name]
    return sorted(names)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Inputs most commands need: a tokenizer, a bundle, eval and bench results (from a stand-in server)."""
    import soarpack

    tmp = tmp_path_factory.mktemp("format-json")
    tok = make_tiny_tokenizer(tmp / "tok")
    data = tmp / "d.jsonl"
    data.write_text("".join(json.dumps({"task": "qa", "question": f"q{i}", "gold": ["x"]}) + "\n" for i in range(3)))
    speed = tmp / "s.jsonl"
    speed.write_text("".join(json.dumps({"question": f"row {i} the river", "model_response": "tok tok tok"}) + "\n"
                             for i in range(3)))
    res = runner.invoke(app, ["build", "--no-wheels", "-o", str(tmp / "b.tar.gz")])
    assert res.exit_code == 0, res.output
    with FakeSGLang(chat=lambda q: ChatReply("</think>x"), generate=GenerateScript(ttft_s=0.0, token_delay_s=0.0)) as s:
        soarpack.eval(api_base=s.url, data=data, output=tmp / "e.json", label="a")
        soarpack.bench(api_base=s.url, s1=speed, s8=speed, smax=speed, model_dir=tok, settle=0,
                       output=tmp / "bench.json", label="a")
    log = tmp / "prepare_env.log"
    log.write_text("ImportError: cannot import name 'ScalingType' from 'torch.nn.functional'\n")
    return {"tmp": tmp, "tok": tok, "data": data, "speed": speed, "bundle": tmp / "b.tar.gz", "log": log}


@pytest.fixture
def server():
    with FakeSGLang(chat=lambda q: ChatReply("</think>x"), generate=GenerateScript(ttft_s=0.0, token_delay_s=0.0)) as s:
        yield s


def _serve_check(work, tmp_path, monkeypatch):
    from soarpack.serve import forkcheck as F

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "fork" / "python" / "sglang").mkdir(parents=True)
    monkeypatch.setattr(F, "run_fork_check", lambda *a, **k: F.ForkCheckResult(True, "fork tree: pass", "table", []))
    return ["serve-check", str(tmp_path / "ckpt"), "--sglang-src", str(tmp_path / "fork" / "python")]


def _rehearse_server(work, tmp_path, monkeypatch):
    from soarpack.rehearse import server as R
    from soarpack.steps import Event, RunReport, StepResult

    def fake(ckpt, profile, data, out_dir, **kwargs):
        kwargs["on_event"](Event("info", "server start", "waiting for /health"))
        report = RunReport([StepResult("server start", "pass", seconds=1.5)])
        return R.RehearsalResult(True, "served", "gate: pass", Path(out_dir), Path(out_dir) / "server.log", report,
                                 score={"final_score": 12.5})

    monkeypatch.setattr(R, "rehearse_server", fake)
    (tmp_path / "ckpt").mkdir()
    return ["rehearse-server", str(tmp_path / "ckpt"), "--data", str(work["data"]), "-o", str(tmp_path / "r")]


def _wheels(sub):
    def args(work, tmp_path, monkeypatch):
        from soarpack.bundle import wheels as W

        monkeypatch.setenv("SOARPACK_CACHE", str(tmp_path / "cache"))
        monkeypatch.setattr(W, "fetch_into_cache", lambda lock, cache, on_event: None)  # no network here
        monkeypatch.setattr(W, "resolve_lock", lambda on_event: W.LOCK_PATH)
        return ["wheels", sub]
    return args


def _cache(sub):
    def args(work, tmp_path, monkeypatch):
        monkeypatch.setenv("SOARPACK_CACHE", str(tmp_path / "cache"))
        (tmp_path / "cache" / "wheels").mkdir(parents=True)
        (tmp_path / "cache" / "wheels" / "x.whl").write_bytes(b"x" * 5000)
        return ["cache", sub]
    return args


def _kernels(work, tmp_path, monkeypatch):
    from soarpack.kernels import measure

    monkeypatch.setenv(measure.BACKEND_ENV, "kernels_standin:backend")
    return ["kernels", "--recipe", "w4-mlp", "--m", "1,8192"]


def _fork(sub):
    def args(work, tmp_path, monkeypatch, request):
        tree = next(iter(request.getfixturevalue("sglang_fork_trees").values()))
        return ["sglang", sub, "--sglang-src", str(tree), *(["-o", str(tmp_path / "out")] if sub == "apply" else [])]
    return args


def _quantized(request, tmp_path):
    tiny = request.getfixturevalue("tiny_model_dir")
    return tiny, ["quantize", str(tiny), str(tmp_path / "q"), "--recipe", "w4-full", "--rows", "8", "--max-len", "64",
                  "--device", "cpu", "--no-report"]


def _verify(work, tmp_path, monkeypatch, request):
    tiny, args = _quantized(request, tmp_path)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return ["verify", str(tmp_path / "q"), "--original", str(tiny), "--device", "cpu"]


def _eval(work, tmp_path, monkeypatch, request):
    url = request.getfixturevalue("server").url
    return ["eval", "--api-base", url, "--data", str(work["data"]), "-o", str(tmp_path / "e.json")]


def _bench(work, tmp_path, monkeypatch, request):
    url = request.getfixturevalue("server").url
    return ["bench", "--api-base", url, "--s1", str(work["speed"]), "--model-dir", str(work["tok"]), "--settle", "0",
            "-o", str(tmp_path / "b.json")]


TORCH = pytest.mark.needs_torch
SLOW = [pytest.mark.slow, pytest.mark.gptq, pytest.mark.needs_torch]

CASES = {
    "tiny-model": (lambda w, t, m: ["tiny-model", str(t / "tiny"), "--layers", "2"], [TORCH]),
    "calib": (lambda w, t, m, r: ["calib", "--model-dir", str(r.getfixturevalue("tiny_model_dir")), "--rows", "4",
                                  "--max-len", "64"], [TORCH]),
    "quantize": (lambda w, t, m, r: _quantized(r, t)[1], SLOW),
    "verify": (_verify, SLOW),
    "serve-check": (_serve_check, []),
    "recipes": (lambda w, t, m: ["recipes"], []),
    "profiles": (lambda w, t, m: ["profiles"], []),
    "args": (lambda w, t, m: ["args", "safe"], []),
    "build": (lambda w, t, m: ["build", "--no-wheels", "-o", str(t / "x.tar.gz")], []),
    "inspect": (lambda w, t, m: ["inspect", str(w["bundle"])], []),
    "check": (lambda w, t, m: ["check", str(w["bundle"]), "--no-rehearse"], []),
    "eval": (_eval, []),
    "bench": (_bench, []),
    "speedset": (lambda w, t, m: ["speedset", "--model-dir", str(w["tok"]), "-n", "3", "-o", str(t / "s.jsonl")], []),
    "score": (lambda w, t, m: ["score", "--ours", str(w["tmp"] / "bench.json"), "--eval", str(w["tmp"] / "e.json"),
                               "--best", str(w["tmp"] / "bench.json")], []),
    "compare": (lambda w, t, m: ["compare", str(w["tmp"] / "e.json"), str(w["tmp"] / "bench.json")], []),
    "rehearse-server": (_rehearse_server, []),
    "diagnose": (lambda w, t, m: ["diagnose", str(w["log"])], []),
    "env": (lambda w, t, m: ["env", "--no-sizes"], []),
    "kernels": (_kernels, [TORCH]),
    "wheels fetch": (_wheels("fetch"), []),
    "wheels lock": (_wheels("lock"), []),
    "cache list": (_cache("list"), []),
    "cache clear": (_cache("clear"), []),
    "sglang check": (_fork("check"), []),
    "sglang apply": (_fork("apply"), []),
    "sglang list": (lambda w, t, m: ["sglang", "list"], []),
}
# fake-server runs until stopped: its own test below, in a child process


def test_the_cases_are_every_command():
    assert sorted([*CASES, "fake-server"]) == leaf_commands()


def assert_one_json_document_and_progress_only(stdout: str, stderr: str) -> object:
    document = json.loads(stdout)  # exactly one document: anything after it fails to parse
    for line in stderr.splitlines():
        assert not line.strip() or PROGRESS.match(line), f"not a progress line on stderr: {line!r}\n{stderr}"
    return document


@pytest.mark.parametrize("command", [pytest.param(name, marks=marks) for name, (_, marks) in CASES.items()])
def test_format_json_prints_one_document_and_only_progress(command, work, tmp_path, monkeypatch, request):
    make_args = CASES[command][0]
    takes_request = make_args.__code__.co_argcount == 4
    args = make_args(work, tmp_path, monkeypatch, request) if takes_request else make_args(work, tmp_path, monkeypatch)
    res = runner.invoke(app, ["--format", "json", *args])
    assert res.exit_code in (0, 1), res.output  # 1: a verdict (check --no-rehearse, diagnose's finding)
    assert res.stdout.strip(), res.stderr
    assert_one_json_document_and_progress_only(res.stdout, res.stderr)


def test_fake_server_prints_its_address_as_one_document():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "soarpack", "--format", "json", "fake-server", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("}"):
            break
    proc.send_signal(signal.SIGTERM)
    rest, err = proc.communicate(timeout=60)  # a bound for a loaded machine, not a speed
    assert proc.returncode == 0
    doc = assert_one_json_document_and_progress_only("".join(lines) + rest, err)
    assert doc["stand_in"] is True


@pytest.mark.parametrize("command", ["eval", "bench", "score", "compare"])
def test_a_verdict_is_in_the_json_and_the_exit_code_not_on_stderr(command, work, tmp_path):
    """Below the gate: eval, score and compare exit 1 with the verdict in the document, and no line says it."""
    low = tmp_path / "low.json"
    report = json.loads((work["tmp"] / "e.json").read_text())
    report.update(ori_accuracy=40.0, overall_accuracy=50.0)  # overall = 1.25 ori, as eval writes it
    low.write_text(json.dumps(report))
    args = {"score": ["score", "--ours", str(work["tmp"] / "bench.json"), "--eval", str(low),
                      "--best", str(work["tmp"] / "bench.json")],
            "compare": ["compare", str(low), str(work["tmp"] / "bench.json")]}.get(command)
    if args is None:  # eval and bench: a server whose requests all fail
        with FakeSGLang(chat=lambda q: ChatReply("", status=500),
                        generate=GenerateScript(ttft_s=0.0, token_delay_s=0.0, status=500)) as s:
            args = (["eval", "--api-base", s.url, "--data", str(work["data"]), "-o", str(tmp_path / "e.json")]
                    if command == "eval" else
                    ["bench", "--api-base", s.url, "--s1", str(work["speed"]), "--model-dir", str(work["tok"]),
                     "--settle", "0", "--no-warmup", "-o", str(tmp_path / "b.json")])
            res = runner.invoke(app, ["--format", "json", *args])
    else:
        res = runner.invoke(app, ["--format", "json", *args])
    assert res.exit_code == 1, res.output
    assert_one_json_document_and_progress_only(res.stdout, res.stderr)
