"""`soarpack eval` against a real scripted HTTP server on 127.0.0.1."""

import json
import time

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import MAX_HOLD_S, ChatReply, FakeSGLang
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.measure.evaluate import EvalConfig, run_eval
from soarpack.cli import app
from soarpack.errors import InputDataError


def in_output(text, result):
    """`text` in the CLI output, ignoring the line wrapping of the 80-column console."""
    return "".join(text.split()) in "".join(result.output.split())

# Each row: (task, gold, scripted answer, expected score)
CASES = [
    ("mcq", "B", "let me think</think>ANSWER: b", 1.0),
    ("mcq", "B", "ANSWER: B</think>so it is \\boxed{\\text{C}}", 0.0),  # only `final` counts
    ("mcq", "C", "</think>\\boxed{\\text{C}}", 1.0),
    ("mcq", "D", "no think tag, \\boxed{D}", 1.0),
    ("mcq", "A", "</think>I am not sure", 0.0),
    ("niah", ["7421"], "</think>The magic number is 7421.", 1.0),
    ("niah", ["7421"], "7421 appears in my thoughts</think>I cannot find it", 0.0),
    ("qa", ["Marie Curie", "Curie"], "</think>It was CURIE.", 1.0),
    ("cwe", ["alpha", "beta", "gamma", "delta"], "</think>Alpha, BETA, gamma", 0.75),
    ("fwe", ["one", "two"], "</think>two", 0.5),
    ("other", "Yes", "thinking yes</think>no", 1.0),  # unknown task: raw prediction
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def case_rows():
    return [{"task": t, "question": f"question {i}", "gold": g} for i, (t, g, _, _) in enumerate(CASES)]


def scripted(delay_s=0.0):
    answers = {f"question {i}": ChatReply(a, delay_s=delay_s) for i, (_, _, a, _) in enumerate(CASES)}
    return lambda q: answers[q]


def test_every_task_type_scores_as_specified(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", case_rows())
    with FakeSGLang(chat=scripted()) as server:
        report = run_eval(EvalConfig(api_base=server.url, data=data, output=tmp_path / "out.json", concurrency=4))
    assert [r["score"] for r in report["rows"]] == [expected for *_, expected in CASES]
    assert len(CASES) == 11 and sum(e for *_, e in CASES) == 7.25
    assert report["ori_accuracy"] == 65.91  # 7.25 / 11, in percent
    assert report["overall_accuracy"] == 82.39  # 65.91 against the platform's 80-point reference
    assert report["per_task"]["mcq"]["count"] == 5 and report["per_task"]["mcq"]["accuracy"] == 60.0
    assert report["complete"] and report["errors"] == []
    saved = json.loads((tmp_path / "out.json").read_text())
    assert saved["rows"][0]["prediction"] == CASES[0][2] and saved["rows"][0]["extracted"] == "B"
    assert saved["rows"][0]["output_tokens"] == len(CASES[0][2].split())
    assert saved["rows"][0]["latency_s"] >= 0


def test_request_shape_is_the_platforms(tmp_path):
    model_dir = make_tiny_tokenizer(tmp_path / "model", eos_ids=(2, 3))
    data = write_jsonl(tmp_path / "d.jsonl", [{"task": "mcq", "question": "Pick one.", "gold": "A"}])
    with FakeSGLang(model_id="served-sala") as server:
        run_eval(EvalConfig(api_base=server.url, data=data, model_dir=model_dir, output=tmp_path / "o.json"))
        body = server.chat_bodies[0]
    assert body["model"] == "served-sala"
    assert body["messages"] == [{"role": "user", "content": "Pick one."}]
    assert body["temperature"] == 0 and body["max_tokens"] == 65536
    assert sorted(body["stop"]) == ["</s>", "<|im_end|>"]


def test_no_more_than_n_requests_in_flight(tmp_path):
    rows = [{"task": "niah", "question": f"q{i}", "gold": ["x"]} for i in range(24)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    # The first 5 rows (sent first) are held by the server until 5 requests are in flight, its own count rather
    # than a delay: the cap is reached however slow the machine is; the rest are answered at once.
    first = {f"q{i}" for i in range(5)}
    reply = lambda q: ChatReply("</think>x", hold_until_in_flight=5 if q in first else 0)  # noqa: E731
    with FakeSGLang(chat=reply) as server:
        run_eval(EvalConfig(api_base=server.url, data=data, output=None, concurrency=5))
        assert server.max_in_flight["chat"] == 5  # reached, never exceeded
        assert len(server.chat_bodies) == 24


def test_timeout_and_server_error_score_zero_and_the_run_continues(tmp_path):
    # The slow reply is held until the server stops (MAX_HOLD_S at most): uncut, the run could not end before it.
    replies = {"slow": ChatReply("</think>x", delay_s=MAX_HOLD_S), "broken": ChatReply("x", status=500)}
    rows = [{"task": "niah", "question": q, "gold": ["x"]} for q in ("ok1", "slow", "broken", "ok2")]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    with FakeSGLang(chat=lambda q: replies.get(q, ChatReply("</think>x"))) as server:
        start = time.perf_counter()
        report = run_eval(EvalConfig(api_base=server.url, data=data, output=tmp_path / "o.json", concurrency=2, timeout_s=0.5))
        assert time.perf_counter() - start < MAX_HOLD_S  # cut by the timeout, not by the reply (a causal bound)
    assert [r["score"] for r in report["rows"]] == [1.0, 0.0, 0.0, 1.0]
    errors = {e["index"]: e["error"] for e in report["errors"]}
    assert "timeout" in errors[1] and "HTTP 500" in errors[2]
    assert report["ori_accuracy"] == 50.0  # errors count in the denominator


def test_resume_skips_scored_rows_and_resends_errors(tmp_path):
    rows = [{"task": "niah", "question": f"q{i}", "gold": ["x"]} for i in range(6)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "o.json"
    with FakeSGLang(chat=lambda q: ChatReply("x", status=500) if q == "q4" else ChatReply("</think>x")) as server:
        first = run_eval(EvalConfig(api_base=server.url, data=data, output=out, rows=5))
        assert len(server.chat_bodies) == 5 and first["scored"] == 5 and first["ori_accuracy"] == 80.0
    with FakeSGLang(chat=lambda q: ChatReply("</think>x")) as server:  # the same model, restarted on another port
        second = run_eval(EvalConfig(api_base=server.url, data=data, output=out, resume=True))
        sent = sorted(b["messages"][0]["content"] for b in server.chat_bodies)
    assert sent == ["q4", "q5"]  # q0-q3 were scored; q4 had errored; q5 was never sent
    assert second["complete"] and second["ori_accuracy"] == 100.0


def test_resume_refuses_output_from_other_data(tmp_path):
    out = tmp_path / "o.json"
    a = write_jsonl(tmp_path / "a.jsonl", [{"task": "niah", "question": "q-a", "gold": ["x"]}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"task": "niah", "question": "q-b", "gold": ["x"]}])
    with FakeSGLang(chat=lambda q: ChatReply("</think>x")) as server:
        run_eval(EvalConfig(api_base=server.url, data=a, output=out))
        with pytest.raises(InputDataError, match="different data file"):
            run_eval(EvalConfig(api_base=server.url, data=b, output=out))


def test_malformed_line_is_reported_with_its_number_before_any_request(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"task": "mcq", "question": "q", "gold": "A"}\n\n{"task": "mcq", "question": \n')
    with FakeSGLang() as server:
        result = CliRunner().invoke(app, ["eval", "--api-base", server.url, "--data", str(data), "-o", str(tmp_path / "o.json")])
        assert server.chat_bodies == [] and server.events == []
    assert result.exit_code == 2
    assert in_output("d.jsonl:3: not valid JSON", result)


def test_missing_key_names_the_line(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"task": "mcq", "question": "q", "gold": "A"}, {"task": "mcq", "question": "q"}])
    with pytest.raises(InputDataError, match=r"d.jsonl:2: missing key\(s\) gold"):
        run_eval(EvalConfig(api_base="http://127.0.0.1:9", data=data))


def test_cli_eval_prints_table_and_writes_json(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", case_rows())
    out = tmp_path / "o.json"
    with FakeSGLang(chat=scripted()) as server:
        result = CliRunner().invoke(app, ["eval", "--api-base", server.url, "--data", str(data), "-o", str(out),
                                          "--concurrency", "3", "--json"])
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["ori_accuracy"] == json.loads(out.read_text())["ori_accuracy"]
    assert "rows" not in summary
    # the scripted answers score 65.91: C = 0, a no-go, so the command fails after writing everything
    assert summary["c_factor"] == 0.0 and result.exit_code == 1
    assert in_output("below the accuracy gate", result) and in_output("C = 0.0", result)


def test_cli_eval_above_the_gate_exits_0(tmp_path):
    rows = [{"task": "mcq", "question": f"q{i}", "gold": "B"} for i in range(3)]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    with FakeSGLang(chat=lambda body: ChatReply("</think>ANSWER: B")) as server:
        result = CliRunner().invoke(app, ["eval", "--api-base", server.url, "--data", str(data),
                                          "-o", str(tmp_path / "o.json")])
    assert result.exit_code == 0, result.output


def test_cli_eval_unreachable_server_is_one_clear_error(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"task": "mcq", "question": "q", "gold": "A"}])
    with FakeSGLang() as server:
        url = server.url
    result = CliRunner().invoke(app, ["eval", "--api-base", url, "--data", str(data), "-o", str(tmp_path / "o.json")])
    assert result.exit_code == 2 and in_output("/v1/models", result)
