"""soarpack's Python API (soarpack.api): lazy at the package root, the CLI's names, old names deprecated, typed
results, quiet, and the CLI a thin layer over it."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import soarpack
from soarpack import api
from soarpack import API_NAMES
from soarpack.deprecation import renamed_map
from soarpack.errors import SoarpackError
from under_test import SOARPACK_ROOT

HEAVY = ("torch", "transformers", "gptqmodel", "typer", "rich")
# (CLI command, API function) pairs whose names must agree
COMMANDS = {"quantize": "quantize", "build": "build", "check": "check", "eval": "eval", "bench": "bench",
            "score": "score", "compare": "compare", "diagnose": "diagnose", "tiny-model": "tiny_model"}


def _fresh(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=SOARPACK_ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# -- lazy, light ---------------------------------------------------------------------------------------------------


def test_import_soarpack_loads_no_heavy_library_and_lists_the_api():
    out = json.loads(_fresh("import json, sys, soarpack\n"
                            f"print(json.dumps({{'loaded': [m for m in {HEAVY!r} if m in sys.modules], "
                            "'dir': dir(soarpack), 'all': soarpack.__all__}))"))
    assert out["loaded"] == []
    assert set(API_NAMES) <= set(out["dir"]) and out["all"] == [n for n in API_NAMES if n != "eval"]


@pytest.mark.parametrize("name", API_NAMES)
def test_touching_an_api_name_imports_no_heavy_library(name):
    out = json.loads(_fresh(f"import json, sys, soarpack\nf = soarpack.{name}\n"
                            f"print(json.dumps({{'callable': callable(f), 'loaded': [m for m in {HEAVY!r} "
                            "if m in sys.modules]}))"))
    assert out == {"callable": True, "loaded": []}


def test_bench_and_diagnose_stay_the_api_functions_after_their_packages_are_imported(tmp_path):
    # The measurements and the diagnosis live in packages whose names are no API name: importing them binds
    # soarpack.measure and soarpack.diagnosis, never soarpack.bench or soarpack.diagnose.
    import soarpack.diagnosis.scan  # noqa: F401
    import soarpack.measure.speed  # noqa: F401

    assert soarpack.bench is api.bench and soarpack.diagnose is api.diagnose
    assert "Time the S1, S8 and Smax tiers" in inspect.getdoc(soarpack.bench)
    (tmp_path / "quantize.log").write_text("all fine\n")
    assert soarpack.diagnose(tmp_path / "quantize.log").findings == []  # called: runs soarpack.api.diagnose


def test_no_subpackage_bears_an_api_name():
    packages = {p.parent.name for p in (Path(soarpack.__file__).parent).glob("*/__init__.py")}
    modules = {p.stem for p in Path(soarpack.__file__).parent.glob("*.py")}
    assert (packages | modules) & set(API_NAMES) == set()


def test_help_of_quantize_reads_as_user_documentation():
    text = _fresh("import soarpack; help(soarpack.quantize)")
    assert "quantize(model_dir" in text and "Parameters" in text and "Returns" in text and "Example" in text
    assert "--max-sanity-loss" in text


@pytest.mark.parametrize("name", API_NAMES)
def test_every_api_function_documents_each_of_its_parameters(name):
    fn = getattr(api, name)
    doc = inspect.getdoc(fn)
    assert "Example" in doc and doc.splitlines()[0].endswith(".")
    for param in inspect.signature(fn).parameters:
        assert param in doc, f"{name}: parameter {param} is not described"


# -- the CLI's names -----------------------------------------------------------------------------------------------

# That each command's options are its API function's keywords, with the same defaults and old names, is
# tests/test_request.py's: both are derived from one typed request per command.


class Spied(SoarpackError):
    pass


CLI_ARGS = {
    "quantize": ["m", "o"], "build": [], "check": ["b.tar.gz"], "eval": ["--api-base", "http://x", "--data", "d"],
    "bench": ["--api-base", "http://x"], "score": ["--ours", "o.json"], "compare": ["r.json"], "diagnose": ["l.log"],
    "tiny-model": ["t"],
}


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.needs_torch) if c == "quantize" else c
                                     for c in COMMANDS])  # quantize's command imports torch before the call
def test_the_command_calls_the_api_function(command, monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from soarpack.cli import app

    calls = []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        raise Spied("spied")

    monkeypatch.setattr(api, COMMANDS[command], spy)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, [command, *CLI_ARGS[command]])
    assert len(calls) == 1, result.output
    assert result.exit_code == 2 and "spied" in result.output


# -- old names: deprecated aliases, one test each -----------------------------------------------------------------


class Captured(Exception):
    pass


def _capture(monkeypatch, module: str, attr: str):
    """Replace a library function the API calls; the test reads what reached it."""
    import importlib

    seen = {}

    def fake(*args, **kwargs):
        seen["args"], seen["kwargs"] = args, kwargs
        raise Captured()

    monkeypatch.setattr(importlib.import_module(module), attr, fake)
    return seen


def _call_expecting_alias(fn, old, new, **kwargs):
    with pytest.warns(DeprecationWarning, match=f"{old}= is now {new}="):
        with pytest.raises(Captured):
            fn(**kwargs)


EVAL_BASE = {"api_base": "http://127.0.0.1:9", "data": "d.jsonl"}
BENCH_BASE = {"api_base": "http://127.0.0.1:9", "s1": "s1.jsonl", "model_dir": "m"}


@pytest.mark.parametrize("old,new,value,read", [
    ("num_samples", "rows", 3, lambda cfg: cfg.rows),
    ("model_path", "model_dir", "m", lambda cfg: cfg.model_dir),
    ("timeout_s", "timeout", 7.0, lambda cfg: cfg.timeout_s),
    ("stall_s", "stall_timeout", 8.0, lambda cfg: cfg.stall_s),
    ("deadline_s", "deadline", 9.0, lambda cfg: cfg.deadline_s),
])
def test_eval_old_keyword(monkeypatch, old, new, value, read):
    seen = _capture(monkeypatch, "soarpack.measure.evaluate", "run_eval")
    _call_expecting_alias(api.eval, old, new, **EVAL_BASE, **{old: value})
    assert str(read(seen["args"][0])) == str(value)


@pytest.mark.parametrize("old,new,value,read", [
    ("num_prompts", "rows", 3, lambda cfg: cfg.rows),
    ("tokenizer_dir", "model_dir", "tok", lambda cfg: cfg.model_dir),
    ("tokenizer", "model_dir", "tok", lambda cfg: cfg.model_dir),
    ("flush_cache", "flush", False, lambda cfg: cfg.flush_cache),
    ("settle_s", "settle", 0.5, lambda cfg: cfg.settle_s),
    ("stall_s", "stall_timeout", 8.0, lambda cfg: cfg.stall_s),
    ("deadline_s", "deadline", 9.0, lambda cfg: cfg.deadline_s),
])
def test_bench_old_keyword(monkeypatch, old, new, value, read):
    seen = _capture(monkeypatch, "soarpack.measure.speed", "run_bench")
    base = {k: v for k, v in BENCH_BASE.items() if not (new == "model_dir" and k == "model_dir")}
    _call_expecting_alias(api.bench, old, new, **base, **{old: value})
    assert str(read(seen["args"][0])) == str(value)


def test_check_old_keyword_sglang_fork(monkeypatch, tmp_path):
    seen = _capture(monkeypatch, "soarpack.rehearse.check", "check_bundle")
    _call_expecting_alias(api.check, "sglang_fork", "sglang_src", bundle=tmp_path / "b.tar.gz", sglang_fork="fork")
    assert seen["kwargs"]["sglang_src"] == Path("fork")


@pytest.mark.parametrize("old,new,value,read", [
    ("out", "output", "b.tar.gz", lambda s: s["args"][0]),
])
def test_build_old_keyword(monkeypatch, old, new, value, read):
    seen = _capture(monkeypatch, "soarpack.bundle.build", "build_bundle")
    _call_expecting_alias(api.build, old, new, **{old: value})
    assert str(read(seen)) == str(value)


@pytest.mark.needs_torch
@pytest.mark.parametrize("old,new,value,read", [
    ("log_file", "log", "q.log", lambda opts: opts.log_file),
    ("sanity_max_loss", "max_sanity_loss", 5.0, lambda opts: opts.sanity_max_loss),
])
def test_quantize_old_keyword(monkeypatch, old, new, value, read):
    seen = _capture(monkeypatch, "soarpack.quant.run", "quantize")
    _call_expecting_alias(api.quantize, old, new, model_dir="m", out_dir="o", **{old: value})
    assert str(read(seen["args"][2])) == str(value)


def test_every_deprecated_keyword_has_a_test_above():
    tested = {"eval": {"num_samples", "model_path", "timeout_s", "stall_s", "deadline_s"},
              "bench": {"num_prompts", "tokenizer_dir", "tokenizer", "flush_cache", "settle_s", "stall_s", "deadline_s"},
              "check": {"sglang_fork"}, "build": {"out"}, "quantize": {"log_file", "sanity_max_loss"}}
    assert {name: set(renamed_map(getattr(api, name))) for name in API_NAMES if renamed_map(getattr(api, name))} == tested


def test_an_old_and_a_new_keyword_with_different_values_are_refused():
    with pytest.raises(TypeError, match="num_samples= and rows="):
        api.eval(**EVAL_BASE, rows=2, num_samples=3)


def test_the_configs_take_their_old_field_names_with_a_warning():
    from soarpack.measure.evaluate import EvalConfig
    from soarpack.measure.speed import BenchConfig

    with pytest.warns(DeprecationWarning, match="EvalConfig: num_samples= is now rows="):
        assert EvalConfig(api_base="http://x", data=Path("d"), num_samples=3).rows == 3
    with pytest.warns(DeprecationWarning, match="BenchConfig: tokenizer_dir= is now model_dir="):
        assert BenchConfig(api_base="http://x", tiers={}, tokenizer_dir=Path("t")).model_dir == Path("t")
    with pytest.warns(DeprecationWarning, match="BenchConfig: num_prompts= is now rows="):
        assert BenchConfig(api_base="http://x", tiers={}, num_prompts=4).rows == 4
    with pytest.raises(TypeError, match="given twice"):
        BenchConfig(api_base="http://x", tiers={}, rows=3, num_prompts=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn of nothing
        assert EvalConfig(api_base="http://x", data=Path("d"), rows=2).rows == 2


def test_a_refusal_names_the_flag_the_user_knows(tmp_path):
    (tmp_path / "d.jsonl").write_text("")
    with pytest.raises(SoarpackError, match="--rows 0 must be at least 1"):
        api.eval(api_base="http://127.0.0.1:9", data=tmp_path / "d.jsonl", rows=0)
    with pytest.raises(SoarpackError, match="--rows 0 must be at least 1"):
        api.bench(api_base="http://127.0.0.1:9", s1=tmp_path / "d.jsonl", model_dir=tmp_path, rows=0)


# -- typed results, quietly ---------------------------------------------------------------------------------------


def test_eval_bench_score_compare_return_typed_results_and_print_nothing(tmp_path, capfd):
    from soarpack.serve.fake_server import ChatReply, FakeSGLang
    from tiny_tokenizer import make_tiny_tokenizer

    from soarpack.measure.compare import Run
    from soarpack.measure.results import BenchResult, CompareResult, EvalResult, ScoreResult

    tok = make_tiny_tokenizer(tmp_path / "tok")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task": "niah", "question": f"q{i}", "gold": ["x"]}) + "\n" for i in range(4)))
    speed = tmp_path / "s.jsonl"
    speed.write_text("".join(json.dumps({"question": f"row {i} the river", "model_response": "tok tok tok tok"}) + "\n"
                             for i in range(3)))
    events = []
    capfd.readouterr()  # what the set-up printed (transformers' import notice where torch is absent) is not ours
    with FakeSGLang(chat=lambda q: ChatReply("</think>x")) as server:
        ev = api.eval(api_base=server.url, data=data, rows=3, output=tmp_path / "eval.json", label="a",
                      on_event=events.append)
        be = api.bench(api_base=server.url, s1=speed, s8=speed, smax=speed, model_dir=tok, settle=0.0,
                       output=tmp_path / "bench.json", label="a")
    assert isinstance(ev, EvalResult) and (ev.total, ev.scored, ev.failed, ev.complete) == (3, 3, 0, True)
    assert ev.ori_accuracy == 100.0 and ev.to_dict() == json.loads((tmp_path / "eval.json").read_text())
    assert ev.report["num_samples"] == 3  # the file format keeps its key
    assert [e.kind for e in events if e.kind == "progress"] == ["progress"] * 3
    assert isinstance(be, BenchResult) and set(be.tiers) == {"s1", "s8", "smax"} and be.complete
    assert be.to_dict() == json.loads((tmp_path / "bench.json").read_text())
    sc = api.score(ours=tmp_path / "bench.json", eval=tmp_path / "eval.json", best_s1=1, best_s8=1, best_smax=1)
    assert isinstance(sc, ScoreResult) and sc.c_factor == 1.0 and not sc.c_assumed
    assert sc.final_score == sc.speed_score and set(sc.tier_scores) == {"s1", "s8", "smax"}
    cmp = api.compare([tmp_path / "eval.json", tmp_path / "bench.json"])
    assert isinstance(cmp, CompareResult) and [type(r) for r in cmp.runs] == [Run] and cmp.below_gate == []
    assert cmp.to_dict()["runs"][0]["name"] == "a" and "| run" in cmp.render("md")
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def test_score_without_a_best_time_raises_the_commands_error(tmp_path):
    from soarpack.errors import InputDataError

    with pytest.raises(InputDataError, match="best time is missing"):
        api.score(ours=_bench_json(tmp_path))


def _bench_json(tmp_path: Path) -> Path:
    from soarpack.measure.speed import BENCH_KIND

    tier = {"failed": 0, "short_outputs": 0, "duration_s": 2.0}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"kind": BENCH_KIND, "version": 2, "tiers": {t: tier for t in ("s1", "s8", "smax")}}))
    return path


def test_the_clis_sink_renders_the_api_events_as_the_command_does(tmp_path, capsys):
    from soarpack.serve.fake_server import ChatReply, FakeSGLang

    from soarpack.cli.output import Sink

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"task": "niah", "question": "q", "gold": ["x"]}) + "\n")
    with FakeSGLang(chat=lambda q: ChatReply("</think>x")) as server:
        api.eval(api_base=server.url, data=data, on_event=Sink().event)
    out, err = capsys.readouterr()
    assert out == "" and "note: no --model-dir: requests carry no stop strings" in " ".join(err.split())
