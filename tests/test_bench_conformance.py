"""`soarpack bench` and `soarpack eval` held to the organisers' own scripts, run against one stand-in server.

The platform times a submission with SOAR-Toolkit's `bench_serving.sh`, which runs the fork's own
`sglang/bench_serving.py` (`--backend sglang --dataset-name custom --flush-cache`, one tier per run), and scores it
with `eval_model.py`. Both are test data beside the checkout (`../shared/data/soar-toolkit`, the fork's tree from
`../shared/data/sglang-fork`); they run here unmodified, under the platform image's Python stack (the CPython 3.10
stand-in with the fork's pins: transformers 4.57.1 counts the tokens, as on the platform) and under this
environment's, against `soarpack.serve.fake_server` with deterministic delays. What must agree:

- bench: the same requests in the same order (the warm-up, then every tier's dispatch order at S1, the same
  multiset at S8 and Smax), the same `max_new_tokens` per request, the same flush and server-info calls, and tier
  durations within 1 % beyond the time the server saw each client keep it waiting (the delays are scripted so that
  file order would miss by far more: checked below; the server measures the clients' turn-around, which a loaded
  machine stretches, so that no check rests on the machine's speed);
- eval: the same request per row (model, messages, temperature, max_tokens, the stop set) and the same
  `ori_accuracy` on the same answers.

The fork's package root imports its whole frontend and server; `bench_serving.py` and `eval_model.py` need neither,
so a stand-in `sglang` package puts the fork's `sglang/` directory on its `__path__` (the modules run are the fork's
own files). `datasets` (imported by bench_serving at module level, never called by the custom loader) and
`pybase64` (images only) are stood in when the interpreter lacks them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from soarpack.measure.evaluate import EvalConfig, run_eval
from soarpack.measure.speed import load_speed_pairs, prepare_requests
from soarpack.measure.speedset import Bucket, Mix, jsonl_text, make_speedset
from soarpack.measure.tokenizer import count_tokens, load_tokenizer
from soarpack.serve.fake_server import ChatReply, FakeSGLang, GenerateScript
from under_test import SOARPACK_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]

STANDIN_INIT = '''"""A stand-in for the fork's package root (its real __init__ imports the frontend and the server): the fork's
own sglang/ directory is on __path__, so `sglang.bench_serving` is the fork's file."""
import os
__path__.append(os.environ["SOARPACK_FORK_SGLANG"])
Engine = None  # eval_model.py imports it and never uses it
'''
DATASETS_STANDIN = '''"""A stand-in: bench_serving imports load_dataset at module level; the custom loader never calls it."""
def load_dataset(*args, **kwargs):
    raise RuntimeError("datasets stand-in: not for this test")
'''
PYBASE64_STANDIN = '''"""A stand-in (bench_serving encodes images with it; text requests never do)."""
from base64 import b64decode, b64encode
'''
# Request timing of the stand-in server: a TTFT that grows with the prompt, a fixed time per token. Rows differ a lot,
# so that the order of dispatch decides S8's makespan (checked below, so the duration check can fail).
TTFT_PER_CHAR_S = 0.0008
TOKEN_DELAY_S = 0.006
TOKENS_PER_CHUNK = 8
SPEED_MIX = Mix(input=(Bucket(8, 64, 0.5), Bucket(1200, 2400, 0.5)), output=(Bucket(16, 48, 0.5), Bucket(160, 320, 0.5)),
                name="conformance")
SPEED_ROWS = 12
# S1 runs a few long rows of its own: its duration adds every client-side gap between requests (a few ms each on a
# loaded machine), and fewer, longer requests keep that noise well under the 1 % being checked.
S1_MIX = Mix(input=(Bucket(1600, 2400, 1.0),), output=(Bucket(200, 320, 1.0),), name="conformance-s1")
S1_ROWS = 4


def toolkit_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    for base in (here, *here.parents):  # ../shared beside the checkout, or further up for a worktree
        candidate = base / "shared" / "data" / "soar-toolkit"
        if (candidate / "bench_serving.sh").is_file() and (candidate / "eval_model.py").is_file():
            return candidate
    if os.environ.get("CI") == "true":
        pytest.fail("the organisers' scripts (../shared/data/soar-toolkit) are missing in CI")
    pytest.skip("not run: the organisers' scripts (../shared/data/soar-toolkit) are not beside the checkout")


def script(prompt: str) -> GenerateScript:
    return GenerateScript(ttft_s=TTFT_PER_CHAR_S * len(prompt), token_delay_s=TOKEN_DELAY_S,
                          tokens_per_chunk=TOKENS_PER_CHUNK)


def request_time_s(prompt: str, output_len: int) -> float:
    """What the stand-in takes for one request: its TTFT, then one chunk of tokens per chunk delay."""
    chunks = -(-output_len // TOKENS_PER_CHUNK)
    return TTFT_PER_CHAR_S * len(prompt) + (chunks - 1) * TOKEN_DELAY_S * TOKENS_PER_CHUNK


def makespan_s(jobs, concurrency) -> float:
    """The duration of dispatching `jobs` (seconds each) in order behind a semaphore of `concurrency`."""
    slots = [0.0] * (concurrency or len(jobs))
    for job in jobs:
        i = slots.index(min(slots))
        slots[i] += job
    return max(slots)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The served model's tokenizer side: a tiny SALA checkpoint's byte-level BPE tokenizer (trained at test time),
    chat template and generation_config. Its config.json stays behind: the clients load the tokenizer with
    trust_remote_code, and a tiny model's remote code is a placeholder that refuses to import (the release's
    configuration code imports anywhere)."""
    return tokenizer_side(tmp_path_factory.mktemp("conf"), tmp_path_factory.mktemp("served"))


def tokenizer_side(work: Path, served: Path, num_layers: int = 2) -> Path:
    """A tiny SALA checkpoint made under `work`, its tokenizer side copied into `served` (see model_dir)."""
    import shutil

    from soarpack.sala.tiny import make_tiny_model

    tiny = make_tiny_model(work / "tiny", num_layers=num_layers)
    for path in tiny.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy2(path, served / path.name)
    return served


@pytest.fixture(scope="module")
def speed_files(model_dir, tmp_path_factory):
    """{tier: JSONL}: S8 and Smax on 12 rows (a seed whose file order would be 30 % off in S8), S1 on 4 long rows."""
    folder = tmp_path_factory.mktemp("speed")
    files = {}
    for name, rows, mix, seed in (("s1", S1_ROWS, S1_MIX, 3), ("s8", SPEED_ROWS, SPEED_MIX, 10)):
        table, _ = make_speedset(load_tokenizer(model_dir), rows, mix, seed=seed)
        files[name] = folder / f"speed-{name}.jsonl"
        files[name].write_text(jsonl_text(table), encoding="utf-8")
    files["smax"] = files["s8"]
    return files


def _standin_dir(tmp_path: Path, python: str) -> Path:
    root = tmp_path / "standin"
    (root / "sglang").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text(STANDIN_INIT)
    for module, text in (("datasets", DATASETS_STANDIN), ("pybase64", PYBASE64_STANDIN)):
        probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
        if probe.returncode != 0:
            (root / f"{module}.py").write_text(text)
    return root


def _python_bin(tmp_path: Path, python: str) -> Path:
    """A folder whose `python3` is `python`: the organisers' script calls `python3` by name."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "python3"  # not a symlink: a venv's python finds its pyvenv.cfg by the path it is run as
    wrapper.write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


def _organisers_env(tmp_path: Path, python: str, fork: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SOARPACK_"))}
    env.update(PATH=f"{_python_bin(tmp_path, python)}:{env.get('PATH', '/usr/bin:/bin')}",
               PYTHONPATH=str(_standin_dir(tmp_path, python)), SOARPACK_FORK_SGLANG=str(fork / "sglang"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


# The stacks the organisers' scripts run on: the platform image's stand-in (its transformers counts the tokens on the
# platform), and this environment's.
STACKS = ["image", "dev"]


def _python_for(stack: str, tmp_path_factory) -> str:
    if stack == "dev":
        return sys.executable
    from soarpack.imagestack import ensure_image_stack, find_python310

    if find_python310() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no CPython 3.10 here: the platform's client stack cannot be run")
        pytest.skip("no CPython 3.10 here (set SOARPACK_PYTHON310): the platform's client stack is not run")
    return str(ensure_image_stack().python)


def _split_runs(bodies, events):
    """The /generate bodies per bench run: a run is a warm-up, a flush, the timed requests, a /get_server_info. Each
    run keeps the server's timeline from its first timed request to the server-info call."""
    runs, current, body_iter = [], None, iter(bodies)
    for when, what in events:
        if what == "generate_start":
            body = next(body_iter)
            if current is None:
                current = {"warmup": body, "timed": [], "flushed": False, "first_timed_s": None, "timeline": []}
            else:
                current["timed"].append(body)
                if current["first_timed_s"] is None:
                    current["first_timed_s"] = when
        elif what == "flush" and current is not None:
            current["flushed"] = True
        elif what == "server_info" and current is not None:
            current["window_s"] = when - current["first_timed_s"]  # as the server saw it
            current["timeline"].append((when, what))
            runs.append(current)
            current = None
            continue
        if current is not None and current["first_timed_s"] is not None:
            current["timeline"].append((when, what))
    return runs


def client_lag_s(run, concurrency) -> float:
    """The time inside a run's window that the server waited on the client: a slot free while requests were still to
    come, or nothing in flight after the last answer until the server-info call. It is the client's own overhead
    (its turn-around between requests), which a loaded machine stretches; the server's scripted work is the rest."""
    total, cap = len(run["timed"]), concurrency or len(run["timed"])
    lag, in_flight, started = 0.0, 0, 0
    timeline = run["timeline"]
    for (when, what), (later, _) in zip(timeline, timeline[1:]):
        if what == "generate_start":
            in_flight, started = in_flight + 1, started + 1
        elif what == "generate_end":
            in_flight -= 1
        if (in_flight < cap and started < total) or (in_flight == 0 and started == total):
            lag += later - when
    return lag


def _asked(body) -> tuple:
    return body["text"], body["sampling_params"]["max_new_tokens"]


@pytest.mark.parametrize("stack", STACKS)
def test_bench_sends_what_the_organisers_script_sends_and_times_it_alike(stack, model_dir, speed_files, sglang_fork_trees,
                                                                       tmp_path, tmp_path_factory):
    python = _python_for(stack, tmp_path_factory)
    fork = sglang_fork_trees["d29fb130c"]
    toolkit = toolkit_dir()
    env = _organisers_env(tmp_path, python, fork)
    env.update(SPEED_DATA_S1=str(speed_files["s1"]), SPEED_DATA_S8=str(speed_files["s8"]),
               SPEED_DATA_SMAX=str(speed_files["smax"]))
    work = tmp_path / "organisers"
    work.mkdir()

    with FakeSGLang(model_id=str(model_dir), generate=script) as server:
        theirs = subprocess.run(["bash", str(toolkit / "bench_serving.sh"), server.url], cwd=work, env=env,
                                capture_output=True, text=True, timeout=900)
        their_bodies, their_events = list(server.generate_bodies), list(server.events)
    assert theirs.returncode == 0, theirs.stdout[-3000:] + theirs.stderr[-3000:]
    their_durations = json.loads(theirs.stdout.strip().splitlines()[-1])
    assert set(their_durations) == {"S1", "S8", "Smax"} and all(d > 0 for d in their_durations.values()), theirs.stdout[-3000:]

    # soarpack bench in a process of its own, as the organisers' client: neither shares the stand-in's interpreter.
    ours_env = {**os.environ, "PYTHONPATH": SOARPACK_ROOT, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with FakeSGLang(model_id=str(model_dir), generate=script) as server:
        mine = subprocess.run([sys.executable, "-m", "soarpack", "bench", "--api-base", server.url, "--model-dir",
                               str(model_dir), "--trust-remote-code", "--s1", str(speed_files["s1"]), "--s8",
                               str(speed_files["s8"]), "--smax", str(speed_files["smax"]), "-o",
                               str(tmp_path / "bench.json")], cwd=tmp_path, env=ours_env, capture_output=True,
                              text=True, timeout=900)
        our_bodies, our_events = list(server.generate_bodies), list(server.events)
    assert mine.returncode == 0, mine.stdout[-3000:] + mine.stderr[-3000:]

    their_runs, our_runs = _split_runs(their_bodies, their_events), _split_runs(our_bodies, our_events)
    assert len(their_runs) == len(our_runs) == 3  # S1, S8, Smax: each warmed up, flushed and closed by server info
    assert all(run["flushed"] for run in their_runs + our_runs)
    for tier, theirs_run, ours_run in zip(("S1", "S8", "Smax"), their_runs, our_runs):
        assert _asked(ours_run["warmup"]) == _asked(theirs_run["warmup"]), tier
        _assert_same_request(ours_run["warmup"], theirs_run["warmup"])
        assert Counter(map(_asked, ours_run["timed"])) == Counter(map(_asked, theirs_run["timed"])), tier
    # Concurrency 1: the server sees every request in dispatch order.
    assert [_asked(b) for b in our_runs[0]["timed"]] == [_asked(b) for b in their_runs[0]["timed"]]
    for ours_body, theirs_body in zip(our_runs[0]["timed"], their_runs[0]["timed"]):
        _assert_same_request(ours_body, theirs_body)

    # Output lengths: the report's per-request record, in dispatch order, equals what the script asked.
    report = json.loads((tmp_path / "bench.json").read_text())
    asked_by_them = [n for _, n in map(_asked, their_runs[0]["timed"])]
    assert [r["output_len"] for r in report["tiers"]["s1"]["requests"]] == asked_by_them
    assert report["tiers"]["s1"]["data_sha256"] and report["server"]["headline"]["model_path"] == str(model_dir)

    # Durations within 1 %, tier by tier, beyond what the server saw each client make it wait; and the order matters
    # enough here for that check to mean something. The stand-in paces each stream by deadlines, so the server's
    # work is the same for both clients however loaded the machine; the clients' own turn-around between requests
    # is not (a loaded machine stretches the organisers' client more than ours), and the server measures it.
    pairs = load_speed_pairs(speed_files["s8"])
    tokenizer = load_tokenizer(model_dir)
    shuffled = prepare_requests(pairs, lambda text: count_tokens(tokenizer, text), seed=1)
    expected_s8 = makespan_s([request_time_s(r.prompt, r.output_len) for r in shuffled], 8)
    file_order_s8 = makespan_s([request_time_s(q, count_tokens(tokenizer, a)) for q, a in pairs], 8)
    assert abs(file_order_s8 - expected_s8) / expected_s8 > 0.05, "the scripted delays no longer make order matter"
    for i, (tier, name, concurrency) in enumerate((("S1", "s1", 1), ("S8", "s8", 8), ("Smax", "smax", None))):
        mine, theirs_s = report["tiers"][name]["duration_s"], their_durations[tier]
        lags = client_lag_s(our_runs[i], concurrency), client_lag_s(their_runs[i], concurrency)
        assert abs(mine - theirs_s) <= 0.01 * theirs_s + max(lags), \
            f"{tier}: soarpack {mine:.3f} s, organisers' {theirs_s:.3f} s, client lag {lags[0]:.3f} / {lags[1]:.3f} s"
        # Both clocks run from the first timed dispatch to the /get_server_info answer: what each client reports is
        # the window the server saw, plus the last answer's way back (no warm-up, flush or pause inside: each of
        # those is a second or more here).
        for who, reported, run in (("soarpack", mine, our_runs[i]), ("organisers'", theirs_s, their_runs[i])):
            # (bench_serving prints its duration rounded to 0.01 s, so it may read up to 5 ms under the window.)
            assert -0.005 <= reported - run["window_s"] < 0.01 * reported + 0.2, (tier, who, reported, run["window_s"])
    # S8 as the server ran it, net of our client's lag: the fork's seed-1 shuffle, not the file's order.
    s8_work = report["tiers"]["s8"]["duration_s"] - client_lag_s(our_runs[1], 8)
    assert abs(s8_work - expected_s8) / expected_s8 < abs(file_order_s8 - expected_s8) / expected_s8 / 2


def _assert_same_request(ours: dict, theirs: dict) -> None:
    """The same /generate request: the fork also sends its defaults for lora_path and return_routed_experts (None
    and False), which SGLang reads as absent; every key we send, it sends with the same value."""
    extra = {k: v for k, v in theirs.items() if k not in ours}
    assert all(v in (None, False) for v in extra.values()), extra
    assert {k: v for k, v in theirs.items() if k in ours} == ours


EVAL_ROWS = [
    {"task": "mcq", "question": "Pick one: A, B, C or D?", "gold": "B"},
    {"task": "mcq", "question": "Which letter, lower case answer?", "gold": "C"},
    {"task": "mcq", "question": "Boxed text answer?", "gold": "D"},
    {"task": "mcq", "question": "Boxed plain answer?", "gold": "A"},
    {"task": "mcq", "question": "Wrong answer here?", "gold": "A"},
    {"task": "niah", "question": "What is the needle?", "gold": ["blue heron"]},
    {"task": "qa", "question": "Who crossed the bridge?", "gold": ["the children", "kids"]},
    {"task": "qa", "question": "Unanswered question?", "gold": ["nothing"]},
    {"task": "cwe", "question": "Most common words?", "gold": ["river", "bridge", "lamp", "heron"]},
    {"task": "fwe", "question": "Frequent words?", "gold": ["apple", "fish", "wool"]},
    {"task": "fwe", "question": "Server error row?", "gold": ["apple"]},
    {"task": "lcx", "question": "Long context?", "gold": ["observatory"]},
    {"task": "other", "question": "Raw substring task?", "gold": "Tower"},
]
EVAL_ANSWERS = {
    "Pick one: A, B, C or D?": ChatReply("<think>hmm</think>\nANSWER: B"),
    "Which letter, lower case answer?": ChatReply("<think>a</think><think>b</think> answer: c"),
    "Boxed text answer?": ChatReply("</think>so \\boxed{\\text{D}}"),
    "Boxed plain answer?": ChatReply("\\boxed{A}"),
    "Wrong answer here?": ChatReply("</think>ANSWER: C"),
    "What is the needle?": ChatReply("<think>the BLUE HERON?</think> The needle is the Blue Heron."),
    "Who crossed the bridge?": ChatReply("</think>kids did"),
    "Unanswered question?": ChatReply(""),
    "Most common words?": ChatReply("</think>River, bridge and heron"),
    "Frequent words?": ChatReply("<think>apple fish wool</think>apple and wool"),
    "Server error row?": ChatReply(status=500),
    "Long context?": ChatReply("the observatory</think>"),
    "Raw substring task?": ChatReply("<think>the tower</think>done"),
}


@pytest.mark.parametrize("stack", STACKS)
def test_eval_sends_what_eval_model_sends_and_scores_alike(stack, model_dir, sglang_fork_trees, tmp_path,
                                                          tmp_path_factory):
    python = _python_for(stack, tmp_path_factory)
    data = tmp_path / "public.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in EVAL_ROWS), encoding="utf-8")
    env = _organisers_env(tmp_path, python, sglang_fork_trees["d29fb130c"])
    work = tmp_path / "organisers"
    work.mkdir()

    with FakeSGLang(model_id="served-model", chat=EVAL_ANSWERS) as server:
        theirs = subprocess.run([python, str(toolkit_dir() / "eval_model.py"), "--model_path", str(model_dir),
                                 "--api_base", server.url, "--data_path", str(data)], cwd=work, env=env,
                                capture_output=True, text=True, timeout=600)
        their_bodies = list(server.chat_bodies)
    assert theirs.returncode == 0, theirs.stdout[-3000:] + theirs.stderr[-3000:]
    (summary,) = work.glob("outputs/*/summary.json")
    their_ori = json.loads(summary.read_text())["ori_accuracy"]

    with FakeSGLang(model_id="served-model", chat=EVAL_ANSWERS) as server:
        ours = run_eval(EvalConfig(api_base=server.url, data=data, model_dir=model_dir, output=tmp_path / "eval.json"))
        our_bodies = list(server.chat_bodies)

    def by_question(bodies):
        return {b["messages"][0]["content"]: {**b, "stop": sorted(b["stop"])} for b in bodies}

    assert by_question(our_bodies) == by_question(their_bodies)
    assert len(our_bodies) == len(their_bodies) == len(EVAL_ROWS)
    assert ours["ori_accuracy"] == their_ori
    # The answers above score neither 0 nor 100, so an equal ori is a real agreement.
    assert 0 < their_ori < 100 and re.search(r"Average Score: ", theirs.stdout)
