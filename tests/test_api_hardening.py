"""Issue 39, the Python API: it refuses what the command refuses (one validator, one message), an argument of the
wrong type is refused by its name (not an internal TypeError), a huge tiny model is refused up front, and eval/bench
work when called inside a running event loop (a notebook)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

import soarpack
from soarpack.cli import app
from soarpack.errors import ConfigError, SoarpackError

runner = CliRunner()
NOWHERE = "http://127.0.0.1:9"  # nothing listens: a refusal must come before any request


# -- the API refuses exactly what the command refuses ---------------------------------------------------------------

EVAL_BOUNDS = [("--concurrency", "concurrency", 0), ("--rows", "rows", 0), ("--timeout", "timeout", math.nan),
               ("--timeout", "timeout", -1.0), ("--stall-timeout", "stall_timeout", math.inf),
               ("--deadline", "deadline", math.nan), ("--retries", "retries", -1), ("--max-tokens", "max_tokens", 0)]
BENCH_BOUNDS = [("--settle", "settle", math.nan), ("--settle", "settle", -1.0), ("--settle", "settle", math.inf),
                ("--rows", "rows", 0), ("--stall-timeout", "stall_timeout", math.nan),
                ("--deadline", "deadline", -5.0)]


def _cli_error(args) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert lines, res.output
    return lines[0][len("error: "):]


@pytest.mark.parametrize("flag,keyword,value", EVAL_BOUNDS, ids=[f"{f}={v}" for f, _, v in EVAL_BOUNDS])
def test_eval_api_refuses_what_the_cli_refuses_with_the_same_message(tmp_path, flag, keyword, value):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"task": "t", "question": "q", "gold": "A"}) + "\n")
    cli = _cli_error(["eval", "--api-base", NOWHERE, "--data", str(data), "-o", str(tmp_path / "e.json"),
                      flag, f"{value:g}" if isinstance(value, float) else str(value)])
    with pytest.raises(SoarpackError) as api_refusal:
        soarpack.eval(api_base=NOWHERE, data=data, **{keyword: value})
    assert api_refusal.value.message == cli
    assert flag in cli


@pytest.mark.parametrize("flag,keyword,value", BENCH_BOUNDS, ids=[f"{f}={v}" for f, _, v in BENCH_BOUNDS])
def test_bench_api_refuses_what_the_cli_refuses_with_the_same_message(tmp_path, flag, keyword, value):
    speed = tmp_path / "s1.jsonl"
    speed.write_text(json.dumps({"question": "q", "model_response": "a"}) + "\n")
    cli = _cli_error(["bench", "--api-base", NOWHERE, "--model-dir", str(tmp_path), "--s1", str(speed),
                      "-o", str(tmp_path / "b.json"), flag,
                      f"{value:g}" if isinstance(value, float) else str(value)])
    with pytest.raises(SoarpackError) as api_refusal:
        soarpack.bench(api_base=NOWHERE, model_dir=tmp_path, s1=speed, **{keyword: value})
    assert api_refusal.value.message == cli
    assert flag in cli


# -- arguments of the wrong type are refused by name ----------------------------------------------------------------

def _wrong_type_calls(tmp: Path):
    data = tmp / "d.jsonl"
    return {
        "eval api_base=None": ("api_base", lambda: soarpack.eval(api_base=None, data=data)),
        "eval concurrency='4'": ("concurrency", lambda: soarpack.eval(api_base=NOWHERE, data=data, concurrency="4")),
        "eval data=bytes": ("data", lambda: soarpack.eval(api_base=NOWHERE, data=bytes(data))),
        "eval rows=True": ("rows", lambda: soarpack.eval(api_base=NOWHERE, data=data, rows=True)),
        "bench settle='1'": ("settle", lambda: soarpack.bench(api_base=NOWHERE, s1=data, model_dir=tmp, settle="1")),
        "bench s1=bytes": ("s1", lambda: soarpack.bench(api_base=NOWHERE, s1=bytes(data), model_dir=tmp)),
        "quantize model_dir=bytes": ("model_dir", lambda: soarpack.quantize(b"tiny", tmp / "q")),
        "quantize rows='8'": ("rows", lambda: soarpack.quantize(tmp, tmp / "q", rows="8")),
        "build output=bytes": ("output", lambda: soarpack.build(output=b"b.tar.gz")),
        "build calib=[bytes]": ("calib", lambda: soarpack.build(calib=[b"c.jsonl"])),
        "check bundle=bytes": ("bundle", lambda: soarpack.check(b"b.tar.gz")),
        "check accept_risk=str-list-of-ints": ("accept_risk", lambda: soarpack.check(tmp, accept_risk=[1])),
        "score ours=bytes": ("ours", lambda: soarpack.score(ours=b"bench.json")),
        "score best_s1='30'": ("best_s1", lambda: soarpack.score(ours=data, best_s1="30")),
        "compare results=[bytes]": ("results", lambda: soarpack.compare([b"e.json"])),
        "diagnose paths=bytes": ("paths", lambda: soarpack.diagnose(b"log")),
        "tiny_model layers='4'": ("layers", lambda: soarpack.tiny_model(tmp / "t", layers="4")),
        "tiny_model out=None": ("out", lambda: soarpack.tiny_model(None)),
    }


CALLS = list(_wrong_type_calls(Path("x")))


@pytest.mark.parametrize("case", CALLS)
def test_an_argument_of_the_wrong_type_is_refused_by_its_name(tmp_path, case):
    name, call = _wrong_type_calls(tmp_path)[case]
    with pytest.raises(ConfigError) as refusal:
        call()
    function = case.split()[0]
    assert refusal.value.message.startswith(f"soarpack.{function}(): {name}="), refusal.value.message
    assert "must be" in refusal.value.message


def test_the_right_types_in_their_loose_forms_still_pass_the_type_check(tmp_path):
    # str and Path paths, a tuple of paths, an int where a float is asked: refused later for what they are, not
    # for their type
    with pytest.raises(SoarpackError) as refusal:
        soarpack.score(ours=str(tmp_path / "missing.json"), best_s1=30)
    assert "best_s1=" not in refusal.value.message and "ours=" not in refusal.value.message
    with pytest.raises(SoarpackError) as refusal:
        soarpack.compare((tmp_path / "a.json", str(tmp_path / "b.json")))
    assert "results=" not in refusal.value.message


# -- a huge tiny model is refused before anything is made -----------------------------------------------------------

@pytest.mark.parametrize("keywords,flag", [({"layers": 10 ** 12}, "--layers"), ({"hidden": 10 ** 9}, "--hidden"),
                                           ({"vocab": 10 ** 10}, "--vocab"), ({"layers": 0}, "--layers"),
                                           ({"heads": 0}, "--heads")])
def test_a_huge_or_empty_tiny_model_is_refused_up_front(tmp_path, keywords, flag):
    with pytest.raises(ConfigError) as refusal:
        soarpack.tiny_model(tmp_path / "t", **keywords)
    assert flag in refusal.value.message
    assert not (tmp_path / "t").exists()
    args = [a for k, v in keywords.items() for a in (f"--{k}", str(v))]
    assert _cli_error(["tiny-model", str(tmp_path / "t"), *args]) == refusal.value.message


# -- inside a running event loop (a notebook) ---------------------------------------------------------------------

def test_eval_and_bench_run_inside_a_running_event_loop(tmp_path):
    from soarpack.serve.fake_server import FakeSGLang, GenerateScript, made_up_reply
    from tiny_tokenizer import make_tiny_tokenizer

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task": "mcq", "question": f"q {i}", "gold": "A"}) + "\n" for i in range(3)))
    speed = tmp_path / "s1.jsonl"
    speed.write_text("".join(json.dumps({"question": f"row {i}", "model_response": "tok tok"}) + "\n"
                             for i in range(2)))
    tok = make_tiny_tokenizer(tmp_path / "tok")

    server = FakeSGLang(port=0, chat=made_up_reply, generate=GenerateScript(ttft_s=0.0, token_delay_s=0.0))
    server.start()
    try:
        async def notebook_cell():  # a cell's code runs while the notebook's loop runs
            evaluated = soarpack.eval(api_base=server.url, data=data)
            timed = soarpack.bench(api_base=server.url, s1=speed, model_dir=tok, settle=0)
            return evaluated, timed

        evaluated, timed = asyncio.run(notebook_cell())
    finally:
        server.stop()
    assert evaluated.total == 3 and evaluated.failed == 0
    assert timed.tiers["s1"].completed == 2
