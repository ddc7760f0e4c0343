"""Slow steps say what they do: check announces each step as it starts, bench prints plain progress lines when
stderr is not a terminal (a log file, CI)."""

import json

from typer.testing import CliRunner

import soarpack.cli.bench as cli_bench
from soarpack.serve.fake_server import FakeSGLang, GenerateScript
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.bundle.build import build_bundle
from soarpack.cli import app


def test_check_announces_each_step_before_its_result(tmp_path):
    bundle = build_bundle(tmp_path / "b.tar.gz", wheels=False, calib_rows=8).path
    result = CliRunner().invoke(app, ["check", str(bundle), "--no-rehearse"])
    lines = result.output.splitlines()
    for step in ("size", "extract", "structure", "args lint"):
        started = lines.index(f"running: {step} ...")
        assert lines[started + 1].split()[1:1 + len(step.split())] == step.split(), lines[started:started + 2]


def test_bench_prints_plain_progress_lines_off_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_bench, "PLAIN_PROGRESS_EVERY_S", 0.0)
    tokenizer = make_tiny_tokenizer(tmp_path / "model")
    data = tmp_path / "s.jsonl"
    data.write_text("".join(json.dumps({"question": f"row {i} the river", "model_response": "tok tok tok"}) + "\n"
                            for i in range(3)))
    with FakeSGLang(generate=GenerateScript(ttft_s=0.0, token_delay_s=0.0)) as server:
        result = CliRunner().invoke(app, ["bench", "--api-base", server.url, "--s1", str(data), "--model-dir",
                                          str(tokenizer), "-o", str(tmp_path / "b.json"), "--settle", "0"])
    assert result.exit_code == 0, result.output
    progress = [line for line in result.output.splitlines() if line.startswith("bench s1: ")]
    assert [p.split()[2] for p in progress] == ["1/3", "2/3", "3/3"]
