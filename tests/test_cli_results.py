"""Nothing silently reused or overwritten: eval resumes only its own server's result, build never replaces a
bundle without --force and names it by content, and every result records what it measured."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import ChatReply, FakeSGLang
from soarpack.measure.evaluate import EvalConfig, run_eval
from soarpack.bundle.build import build_bundle
from soarpack.bundle.summary import inspect_bundle
from soarpack.cli import app
from soarpack.errors import ConfigError, OutputExistsError


def _data(tmp_path, n=4):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"task": "niah", "question": f"q{i}", "gold": ["x"]}) + "\n" for i in range(n)))
    return path


def _right(q):
    return ChatReply("</think>x")


def _wrong(q):
    return ChatReply("</think>no")


def test_eval_against_another_server_refuses_and_keeps_the_old_result(tmp_path):
    data, out = _data(tmp_path), tmp_path / "eval.json"
    with FakeSGLang(chat=_right) as good:
        run_eval(EvalConfig(api_base=good.url, data=data, output=out))
    before = out.read_bytes()
    with FakeSGLang(chat=_wrong, model_id="other-model") as other:
        result = CliRunner().invoke(app, ["eval", "--api-base", other.url, "--data", str(data), "-o", str(out)])
        assert other.chat_bodies == []  # refused before any request
    assert result.exit_code == 2
    flat = "".join(result.output.split())
    assert "holdsanotherserver'sresult" in flat and "--resume" in flat and "--force" in flat
    assert out.read_bytes() == before  # the first server's scores stay attributed to it


def test_eval_on_the_same_server_says_what_it_resumes(tmp_path):
    data, out = _data(tmp_path), tmp_path / "eval.json"
    notes = []
    with FakeSGLang(chat=_right) as server:
        run_eval(EvalConfig(api_base=server.url, data=data, output=out, rows=3))
        report = run_eval(EvalConfig(api_base=server.url + "/", data=data, output=out), on_event=lambda e: e.kind == "info" and notes.append(e.message))
        assert len(server.chat_bodies) == 4
    assert notes == [f"resuming 3/4 rows from {out}"]
    assert report["complete"] and report["ori_accuracy"] == 100.0


def test_eval_force_starts_over_and_keeps_the_old_file_beside(tmp_path):
    data, out = _data(tmp_path), tmp_path / "eval.json"
    with FakeSGLang(chat=_right) as good:
        run_eval(EvalConfig(api_base=good.url, data=data, output=out))
    old = out.read_bytes()
    with FakeSGLang(chat=_wrong, model_id="other") as other:
        report = run_eval(EvalConfig(api_base=other.url, data=data, output=out, force=True))
        assert len(other.chat_bodies) == 4
    assert report["ori_accuracy"] == 0.0 and report["model"] == "other"
    assert (tmp_path / "eval.old-1.json").read_bytes() == old


def test_eval_resume_across_servers_records_both(tmp_path):
    data, out = _data(tmp_path), tmp_path / "eval.json"
    with FakeSGLang(chat=_right) as first:
        run_eval(EvalConfig(api_base=first.url, data=data, output=out, rows=2))
    with FakeSGLang(chat=_right) as second:
        report = run_eval(EvalConfig(api_base=second.url, data=data, output=out, resume=True))
        assert len(second.chat_bodies) == 2
    assert [s["api_base"] for s in report["servers"]] == [first.url, second.url]
    with pytest.raises(ConfigError, match="contradict"):
        run_eval(EvalConfig(api_base=second.url, data=data, output=out, resume=True, force=True))


def test_api_base_without_scheme_says_add_http(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--api-base", "127.0.0.1:30000", "--data", str(_data(tmp_path))])
    assert result.exit_code == 2
    assert "addhttp://" in "".join(result.output.split()) and "startthe server" not in result.output


def test_results_record_what_they_measured(tmp_path):
    bundle = build_bundle(tmp_path / "b.tar.gz", wheels=False, calib_rows=8)
    data, out = _data(tmp_path), tmp_path / "eval.json"
    with FakeSGLang(chat=_right, model_id="/models/q") as server:
        run_eval(EvalConfig(api_base=server.url, data=data, output=out, label="w4-mlp try 2",
                            bundle=inspect_bundle(bundle.path)))
    saved = json.loads(out.read_text())
    assert saved["measured"]["label"] == "w4-mlp try 2"
    assert saved["measured"]["served_model"]["id"] == "/models/q"
    assert saved["measured"]["bundle"]["sha256"] == __import__("hashlib").sha256(bundle.path.read_bytes()).hexdigest()
    assert saved["measured"]["bundle"]["profile"] == bundle.manifest["profile"]["name"]
    assert saved["measured"]["bundle"]["recipe"] == bundle.manifest["quantize"]["recipe_name"]
    assert saved["measured"]["bundle"]["id"] == bundle.id and bundle.path.name.endswith(".tar.gz")
    assert set(saved["versions"]) == {"soarpack", "python", "httpx"}


def test_build_refuses_an_existing_output_without_force(tmp_path):
    out = tmp_path / "b.tar.gz"
    out.write_bytes(b"an earlier bundle")
    runner = CliRunner()
    result = runner.invoke(app, ["build", "--no-wheels", "-o", str(out)])
    assert result.exit_code == 2 and "--force" in result.output
    assert out.read_bytes() == b"an earlier bundle"
    result = runner.invoke(app, ["build", "--no-wheels", "-o", str(out), "--force"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out) and out.stat().st_size > 1000


def test_default_name_is_profile_recipe_and_content_hash_and_check_finds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    first = runner.invoke(app, ["build", "--no-wheels", "--profile", "safe"])
    assert first.exit_code == 0, first.output
    name = first.stdout.strip()
    manifest = json.loads(__import__("tarfile").open(name).extractfile("MANIFEST.json").read())
    from soarpack.bundle.build import content_hash

    assert name == f"soarpack-safe-{manifest['quantize']['recipe_name']}-{content_hash(manifest)[:8]}.tar.gz"
    before = Path(name).read_bytes()
    again = runner.invoke(app, ["build", "--no-wheels", "--profile", "safe"])  # same content, same name: up to date
    assert again.exit_code == 0 and again.stdout.strip() == name, again.output
    assert f"{name} is up to date" in again.stderr and Path(name).read_bytes() == before
    other = runner.invoke(app, ["build", "--no-wheels", "--profile", "fp8-kv"])
    assert other.exit_code == 0 and other.stdout.strip() != name
    # `check` with no BUNDLE takes the newest soarpack-*.tar.gz here (the two-command quick start)
    checked = runner.invoke(app, ["check", "--no-rehearse"])
    assert f"bundle: {other.stdout.strip()}" in checked.output
