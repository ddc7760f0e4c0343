"""`soarpack diagnose` on logs and results this test produces: soarpack's own failure lines (the entry scripts, the
server wait), a real eval against a scripted server, a failed `check` rehearsal's kept folder; unknown logs, exit
codes and the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import ChatReply, FakeSGLang
from soarpack.cli import app
from soarpack.diagnosis import diagnose, diagnose_text
from soarpack.diagnosis.results import repeated_tail
from soarpack.errors import SoarpackError

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


def ids(diagnosis):
    return {f.entry_id for f in diagnosis.findings}


def finding(diagnosis, entry_id):
    return next(f for f in diagnosis.findings if f.entry_id == entry_id)


# -- soarpack's own failure lines, produced by the real scripts ---------------------------------------------------


def test_preprocess_model_failure_is_named_with_its_cause(tmp_path):
    log = tmp_path / "prepare_model.log"
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(REPO / "preprocess_model.py", bundle)
    (bundle / "MANIFEST.json").write_text(json.dumps({"quantize": {"recipe": "w4-mlp"}}))
    proc = subprocess.run([sys.executable, str(bundle / "preprocess_model.py"), "--input", str(tmp_path / "nope"),
                           "--output", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 1
    log.write_text(proc.stdout + proc.stderr)
    d = diagnose([log])
    f = finding(d, "prepare-model-error")
    assert "is not a directory" in f.detail["cause"] and d.exit_code == 1


def test_prepare_model_sh_without_the_venv_is_named(tmp_path):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(REPO / "prepare_model.sh", bundle)
    env = {k: v for k, v in os.environ.items() if k != "SOARPACK_PYTHON"}
    proc = subprocess.run(["bash", str(bundle / "prepare_model.sh"), "--input", "x", "--output", "y"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 1
    d = diagnose([bundle / "logs"])  # the folder the script logs into
    assert "quantization venv" in finding(d, "prepare-model-error").detail["cause"]


def _source_prepare_env(tmp_path, bundle_env: str, extra_env: dict) -> Path:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    shutil.copy(REPO / "prepare_env.sh", bundle)
    if bundle_env:
        (bundle / "bundle.env").write_text(bundle_env)
    env = dict(os.environ, SOARPACK_IMAGE_PYTHON=str(tmp_path / "no-such-python"), **extra_env)
    env.pop("SGLANG_SERVER_ARGS", None)
    subprocess.run(["bash", "--noprofile", "--norc", "-c", f"source {bundle}/prepare_env.sh"], env=env,
                   capture_output=True, text=True, timeout=120)
    return bundle / "logs" / "prepare_env.log"


def test_prepare_env_failures_are_named_from_its_log(tmp_path):
    log = _source_prepare_env(tmp_path, "", {"SOARPACK_SKIP_SGLANG": "1"})
    d = diagnose([log])
    assert d.inputs[0].kind == "prepare_env"
    assert {"prepare-env-venv-failed", "prepare-env-no-bundle-env"} <= ids(d)


def test_disabled_cuda_graphs_and_the_sglang_fallback_are_named_from_prepare_env_log(tmp_path):
    env_file = ("SOARPACK_BUNDLE_SERVER_ARGS='--attention-backend minicpm_flashinfer --disable-cuda-graph'\n"
                "SOARPACK_BUNDLE_FALLBACK_ARGS='--disable-cuda-graph'\nSOARPACK_BUNDLE_SGLANG=platform\n")
    log = _source_prepare_env(tmp_path, env_file, {"SOARPACK_SGLANG_FORK": str(tmp_path / "no-fork")})
    d = diagnose([log])
    assert {"cuda-graph-disabled", "prepare-env-sglang-fallback"} <= ids(d)
    assert "--disable-cuda-graph" in finding(d, "cuda-graph-disabled").quote


def test_padding_flag_and_the_forks_hint_are_not_a_disabled_graph():
    text = ("SGLANG_SERVER_ARGS=--disable-cuda-graph-padding\n"
            "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n")
    assert "cuda-graph-disabled" not in ids(diagnose_text(text, kind="prepare_env"))


def test_a_server_that_never_gets_healthy_is_named(tmp_path):
    from soarpack.serve.server import ServerError, start_server

    with pytest.raises(ServerError) as err:
        start_server([sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(30)"],
                     port=9, log_path=tmp_path / "server.log", timeout_s=1, poll_s=0.2)
    d = diagnose_text(f"error: {err.value}", kind="log")
    assert ids(d) == {"server-not-ready"}


def test_a_server_that_dies_first_is_named_with_its_own_log(tmp_path):
    from soarpack.serve.server import ServerError, start_server

    boom = "raise AttributeError(\"can't set attribute 'sparse_layer_ids'\")"
    with pytest.raises(ServerError) as err:
        start_server([sys.executable, "-c", boom], port=9, log_path=tmp_path / "server.log", timeout_s=30,
                     poll_s=0.2)
    (tmp_path / "rehearse.log").write_text(f"error: {err.value}\n")
    d = diagnose([tmp_path])
    assert {"server-not-ready", "derived-config-key"} <= ids(d)
    assert finding(d, "derived-config-key").detail["key"] == "sparse_layer_ids"


def test_flash_attn_import_from_remote_code_is_named(tmp_path):
    check_imports = pytest.importorskip("transformers.dynamic_module_utils").check_imports

    modeling = tmp_path / "modeling_minicpm_sala.py"
    modeling.write_text("import torch\nfrom flash_attn import flash_attn_func, flash_attn_varlen_func\n")
    with pytest.raises(ImportError) as err:
        check_imports(str(modeling))
    assert ids(diagnose_text(f"ImportError: {err.value}")) == {"flash-attn-missing"}


# -- eval and bench results from a real run --------------------------------------------------------------------


LOOP = "I will check the answer again. "


def _eval(tmp_path, replies):
    from soarpack.measure.evaluate import EvalConfig, run_eval

    rows = [{"task": task, "question": q, "gold": "B" if task == "mcq" else ["x"]} for q, (task, _) in replies.items()]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval.json"
    with FakeSGLang(chat=lambda q: replies[q][1]) as server:
        run_eval(EvalConfig(api_base=server.url, data=data, output=out, max_tokens=300, save_every_s=0))
    return out


def test_eval_rows_looping_to_max_tokens_empty_or_failed_are_flagged_per_task(tmp_path):
    replies = {
        "q0": ("mcq", ChatReply("<think>" + LOOP * 40, completion_tokens=300)),  # collapse
        "q1": ("niah", ChatReply("<think>" + LOOP * 40, completion_tokens=300)),  # collapse
        "q2": ("mcq", ChatReply("<think>a long but varied thought " + " ".join(str(i) for i in range(400)),
                                completion_tokens=300)),  # at the limit, no loop
        "q3": ("qa", ChatReply(LOOP * 40 + "</think>ANSWER: B", completion_tokens=120)),  # loops, then answers
        "q4": ("qa", ChatReply("<think>nothing to say</think>   ", completion_tokens=12)),  # empty final
        "q5": ("cwe", ChatReply("busy", status=500)),  # HTTP error
        "q6": ("mcq", ChatReply("</think>ANSWER: B", completion_tokens=5)),  # fine
    }
    d = diagnose([_eval(tmp_path, replies)])
    assert d.inputs[0].kind == "eval"
    collapse = finding(d, "eval-repetition-collapse")
    assert collapse.count == 2 and collapse.detail["per_task"] == {"mcq": 1, "niah": 1}
    assert collapse.detail["rows"] == [0, 1] and collapse.detail["at_max_tokens_without_a_loop"] == 1
    assert "I will check the answer again." in collapse.quote
    empty = finding(d, "eval-empty-answer")
    assert empty.detail["per_task"] == {"qa": 1} and empty.detail["rows"] == [4]
    failed = finding(d, "eval-request-error")
    assert failed.detail["per_task"] == {"cwe": 1} and failed.detail["errors"] == {"HTTP 500": 1}
    assert d.exit_code == 1


def test_a_clean_eval_finds_nothing(tmp_path):
    replies = {"q0": ("mcq", ChatReply("</think>ANSWER: B", completion_tokens=5)),
               "q1": ("niah", ChatReply("thinking</think>x is the answer", completion_tokens=9))}
    d = diagnose([_eval(tmp_path, replies)])
    assert d.findings == [] and d.exit_code == 0


def test_repeated_tail_needs_real_repetition():
    assert repeated_tail("ab" * 150)[0] == 2
    assert repeated_tail(LOOP * 20)[1] == LOOP[-len(repeated_tail(LOOP * 20)[1]):]
    assert repeated_tail("x" * 150) is None  # shorter than a loop must be
    assert repeated_tail(" ".join(str(i) for i in range(1000))) is None
    assert repeated_tail("") is None


def test_a_bench_with_failed_requests_is_flagged(tmp_path):
    bench = {"kind": "soarpack.bench", "version": 2, "tiers": {
        "s1": {"num_requests": 4, "failed": 0, "errors": []},
        "s8": {"num_requests": 4, "failed": 3, "errors": ["HTTP 500: boom"]}}}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench))
    f = finding(diagnose([path]), "eval-request-error")
    assert f.kind == "bench" and f.detail["per_tier"] == {"s8": 3} and "HTTP 500" in f.quote


# -- unknown logs, bad input, the CLI ---------------------------------------------------------------------------


UNKNOWN = """starting
INFO loading
WARNING something odd
RuntimeError: first failure here
Traceback (most recent call last):
  File "a.py", line 1, in <module>
    main()
  File "b.py", line 9, in main
    go()
KeyError: 'the last one'
shutting down
"""


def test_an_unknown_log_gets_its_first_error_and_last_traceback(tmp_path):
    path = tmp_path / "server.log"
    path.write_text(UNKNOWN)
    d = diagnose([path])
    assert d.findings == [] and d.exit_code == 0
    (x,) = d.excerpts
    assert x.first_error == "line 4: RuntimeError: first failure here"
    assert x.last_traceback[0] == "Traceback (most recent call last):" and x.last_traceback[-1] == "KeyError: 'the last one'"
    result = runner.invoke(app, ["diagnose", str(path)])
    assert result.exit_code == 0
    assert "no known failure explains it" in result.output and "KeyError: 'the last one'" in result.output


def test_a_clean_log_says_so(tmp_path):
    path = tmp_path / "prepare_model.log"
    path.write_text("[prepare_model.sh 10:00:00] exit 0 after 12 s\nmodules with the largest dequantization error\n")
    result = runner.invoke(app, ["diagnose", str(path)])
    assert result.exit_code == 0 and "no known failure and no error line in 1 file(s)" in result.output


def _empty_dir(p):
    (p / "empty").mkdir()
    return p / "empty"


def _binary(p):
    (p / "b.bin").write_bytes(b"\0\1\2" * 100)
    return p / "b.bin"


@pytest.mark.parametrize("make,message", [
    (lambda p: p / "missing.log", "does not exist"), (_empty_dir, "holds no log"), (_binary, "binary")])
def test_bad_input_exits_2_with_one_line(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises(SoarpackError, match=message):
        diagnose([path])
    result = runner.invoke(app, ["diagnose", str(path)])
    assert result.exit_code == 2 and "error:" in result.output and "Traceback" not in result.output


def test_cli_names_cause_fix_and_source_and_exits_1(tmp_path):
    log = REPO / "tests" / "data" / "diagnose" / "torchao-scalingtype.log"
    result = runner.invoke(app, ["diagnose", str(log)])
    assert result.exit_code == 1
    for text in ("ERROR torchao-scalingtype", "cause:", "fix:", "source: log tests/data/diagnose/torchao-scalingtype.log"):
        assert text in result.output
    data = json.loads(runner.invoke(app, ["diagnose", str(log), "--json"]).output)
    (f,) = data["findings"]
    assert f["entry_id"] == "torchao-scalingtype" and f["sources"] and data["exit_code"] == 1
    assert f["where"] == "line 20"


def test_an_unverified_entry_says_so(tmp_path):
    path = tmp_path / "platform.log"
    path.write_text("ERROR: sglang server not ready after 600 seconds\n")
    result = runner.invoke(app, ["diagnose", str(path)])
    assert result.exit_code == 1 and "platform-server-timeout" in result.output and "UNVERIFIED" in result.output
    f = json.loads(runner.invoke(app, ["diagnose", str(path), "--json"]).output)["findings"][0]
    assert f["unverified"] and "guess" in f["note"]


def test_context_next_to_an_oom_is_reported(tmp_path):
    (tmp_path / "server.log").write_text(
        "server_args=ServerArgs(model_path='/out', chunked_prefill_size=32768, mem_fraction_static=0.85)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB.\n")
    f = finding(diagnose([tmp_path]), "cuda-oom")
    assert f.detail == {"chunked_prefill_size": "32768", "mem_fraction_static": "0.85"}
    assert f.where == "line 2"


# -- a failed check keeps its logs, and diagnose reads them -------------------------------------------------------


@pytest.mark.needs_torch  # the rehearsal makes a tiny model
def test_a_failed_check_keeps_its_logs_prints_the_command_and_diagnose_names_the_failures(tmp_path, monkeypatch):
    from soarpack.bundle.build import build_bundle
    from soarpack.rehearse.check import check_bundle

    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read again
    bundle = build_bundle(tmp_path / "b.tar.gz", wheels=False).path
    # A quantize flag that soarpack refuses at once: prepare_model.sh fails in seconds, as on a bad platform run.
    report = check_bundle(bundle, dev_stack=True, quantize_args="--rows -5 --device cpu --no-report")
    assert not report.ok and report.logs_dir
    kept = Path(report.logs_dir)
    assert kept.parent == tmp_path / "tmp" and (kept / "prepare_env.log").is_file()
    assert json.loads((kept / "check.json").read_text())["steps"]
    d = diagnose([kept])
    assert {"bundle-without-wheels", "prepare-model-error"} <= ids(d)
    # the check report alone names it too: the failed step's detail holds soarpack's error line
    assert "prepare-model-error" in ids(diagnose([kept / "check.json"]))
    assert "--rows" in finding(d, "prepare-model-error").detail["cause"]
    assert not any(p.name.startswith("soarpack-check-") and not p.name.startswith("soarpack-check-failed-")
                   for p in (tmp_path / "tmp").iterdir())  # the rehearsal itself is still removed


def test_check_cli_prints_where_the_logs_are_and_the_diagnose_command(tmp_path, monkeypatch):
    from soarpack.rehearse import check as check_mod
    from soarpack.rehearse.check import CheckReport
    from soarpack.steps import StepResult

    kept = tmp_path / "kept"

    def fake_check(bundle, **kw):
        report = CheckReport(steps=[StepResult("prepare_model.sh", "fail", "exit 1", gates=True)], bundle=str(bundle))
        report.logs_dir = str(kept)
        return report

    monkeypatch.setattr(check_mod, "check_bundle", fake_check)
    (tmp_path / "b.tar.gz").write_bytes(b"")
    result = runner.invoke(app, ["check", str(tmp_path / "b.tar.gz")])
    assert result.exit_code == 1
    assert f"logs are kept in {kept}" in result.output and f"soarpack diagnose {kept}" in result.output


def test_diagnose_reads_a_kept_keep_folder_but_not_the_venvs_beside_the_logs(tmp_path):
    work = tmp_path / "work"
    (work / "bundle" / "logs").mkdir(parents=True)
    (work / "bundle" / "logs" / "prepare_env.log").write_text("[soarpack prepare_env 10:00:00] done\n")
    (work / "check.json").write_text(json.dumps({"steps": [{"name": "prepare_model.sh", "status": "fail",
                                                           "detail": "exit 1"}], "uploadable": False}))
    (work / "image" / "lib").mkdir(parents=True)
    (work / "image" / "lib" / "noise.log").write_text("Traceback (most recent call last):\nKeyError: 1\n")
    d = diagnose([work])
    assert {i.path.name for i in d.inputs} == {"check.json", "prepare_env.log"}


def test_a_check_report_whose_overlay_import_failed_names_torchao(tmp_path):
    # What check's "bundled wheels" step records when the overlay import fails: the last stderr line of the real
    # ImportError (the log produced on the image stand-in), after check's own words (soarpack/rehearse/check.py).
    from soarpack.rehearse.check import CheckReport
    from soarpack.steps import StepResult

    last = (REPO / "tests" / "data" / "diagnose" / "torchao-scalingtype.log").read_text().strip().splitlines()[-1]
    report = CheckReport(steps=[StepResult("bundled wheels", "fail", f"the overlay cannot import the quantization stack: {last}")],
                         bundle="b.tar.gz")
    path = tmp_path / "check.json"
    path.write_text(json.dumps(report.to_dict()))
    d = diagnose([path])
    assert d.inputs[0].kind == "check" and ids(d) == {"torchao-scalingtype"}


def test_an_unknown_failed_check_step_is_shown():
    from soarpack.diagnosis import diagnose_inputs
    from soarpack.diagnosis.inputs import Input

    d = diagnose_inputs([Input(Path("check.json"), "check", "verify: exit 3 after 2 s")])
    assert d.findings == [] and d.excerpts[0].first_error == "line 1: verify: exit 3 after 2 s"
