"""Issue 24, honest resume: a resumed eval reports what today's data and today's request would give.

Stored predictions are scored again against today's gold (a score in the file is never read back); each row is
kept only under the request key it was asked with (question, max_tokens, stop strings, served model, chat
template): a changed key sends the row again and says so; a hand-edited file is one error line, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import ChatReply, FakeSGLang
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.measure.evaluate import EvalConfig, run_eval
from soarpack.cli import app
from soarpack.errors import InputDataError


def write_rows(path: Path, golds) -> Path:
    path.write_text("".join(json.dumps({"task": "niah", "question": f"q{i}", "gold": [g]}) + "\n"
                            for i, g in enumerate(golds)))
    return path


def answer_x(question: str) -> ChatReply:
    return ChatReply("</think>x")


@pytest.fixture
def server():
    """One server for the first run and the resumed ones (the same api base: no --resume needed)."""
    with FakeSGLang(chat=answer_x) as fake:
        yield fake


def first_run(tmp_path, server, golds=("x",) * 4, **kwargs):
    data, out = write_rows(tmp_path / "d.jsonl", golds), tmp_path / "eval.json"
    report = run_eval(EvalConfig(api_base=server.url, data=data, output=out, **kwargs))
    server.chat_bodies.clear()
    return data, out, report


def edit(out: Path, change) -> None:
    saved = json.loads(out.read_text())
    change(saved)
    out.write_text(json.dumps(saved))


def _into(notes: list):
    """The eval's notes (its "info" events) into a list."""
    return lambda event: notes.append(event.message) if event.kind == "info" else None


def flat(result) -> str:
    return "".join(result.output.split())


def test_changed_gold_is_scored_again_not_resumed_at_100(tmp_path, server):
    data, out, first = first_run(tmp_path, server)
    assert first["ori_accuracy"] == 100.0
    write_rows(data, ("y",) * 4)  # today's gold: the stored answers are now all wrong
    notes = []
    resumed = run_eval(EvalConfig(api_base=server.url, data=data, output=out), on_event=_into(notes))
    assert server.chat_bodies == []  # nothing needed asking again: the answers are stored
    assert resumed["ori_accuracy"] == 0.0  # what a fresh run scores
    assert [r["score"] for r in resumed["rows"]] == [0.0] * 4 and resumed["rows"][0]["gold"] == ["y"]
    assert any("score differently against today's data" in n for n in notes), notes


def test_changed_max_tokens_sends_the_rows_again_and_says_so(tmp_path, server):
    data, out, _ = first_run(tmp_path, server, max_tokens=100)
    notes = []
    report = run_eval(EvalConfig(api_base=server.url, data=data, output=out, max_tokens=200), on_event=_into(notes))
    assert [b["max_tokens"] for b in server.chat_bodies] == [200] * 4
    assert report["max_tokens"] == 200 and {r["key"]["max_tokens"] for r in report["rows"]} == {200}
    assert any("re-running 4 stored row(s)" in n and "max_tokens was 100, now 200" in n for n in notes), notes


def test_changed_stop_strings_and_chat_template_send_the_rows_again(tmp_path, server):
    model = Path(make_tiny_tokenizer(tmp_path / "model", eos_ids=(2,)))
    data, out, _ = first_run(tmp_path, server, model_dir=model)
    # the same model directory: everything resumed
    run_eval(EvalConfig(api_base=server.url, data=data, output=out, model_dir=model))
    assert server.chat_bodies == []
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    notes = []
    server.chat_bodies.clear()
    run_eval(EvalConfig(api_base=server.url, data=data, output=out, model_dir=model), on_event=_into(notes))
    assert len(server.chat_bodies) == 4
    assert any("chat_template_sha1 was" in n for n in notes), notes
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    notes = []
    server.chat_bodies.clear()
    run_eval(EvalConfig(api_base=server.url, data=data, output=out, model_dir=model), on_event=_into(notes))
    assert len(server.chat_bodies) == 4 and sorted(server.chat_bodies[0]["stop"]) == ["</s>", "<|im_end|>"]
    assert any("stop was" in n for n in notes), notes


def test_rows_of_another_model_are_asked_again_under_resume(tmp_path, server):
    data, out, _ = first_run(tmp_path, server)
    notes = []
    with FakeSGLang(chat=lambda q: ChatReply("</think>no"), model_id="other-model") as other:
        report = run_eval(EvalConfig(api_base=other.url, data=data, output=out, resume=True), on_event=_into(notes))
        assert len(other.chat_bodies) == 4
    assert report["ori_accuracy"] == 0.0  # the other model's answers, not the first model's 100
    assert any('model was "fake-sala", now "other-model"' in n for n in notes), notes


def test_a_hand_edited_score_cannot_inflate_ori(tmp_path, server):
    data, out, _ = first_run(tmp_path, server)
    edit(out, lambda saved: saved["rows"][0].update(score=50))
    report = run_eval(EvalConfig(api_base=server.url, data=data, output=out))
    assert report["ori_accuracy"] == 100.0  # 4 right answers; the edit would have made it 1325
    assert report["rows"][0]["score"] == 1.0


def test_an_edited_prediction_is_what_gets_scored(tmp_path, server):
    data, out, _ = first_run(tmp_path, server)
    edit(out, lambda saved: saved["rows"][1].update(prediction="</think>wrong", score=1.0))
    report = run_eval(EvalConfig(api_base=server.url, data=data, output=out))
    assert report["ori_accuracy"] == 75.0


@pytest.mark.parametrize("change, said", [
    (lambda s: s["rows"][0].update(prediction=42), "stored row 1 has prediction 42"),
    (lambda s: s["rows"][1].update(index="1"), "stored row 2 has index '1'"),
    (lambda s: s["rows"][2].pop("question_sha1"), "stored row 3 has no question_sha1"),
    (lambda s: s["rows"][0].update(first_error=7), "stored row 1 has first_error 7"),
    (lambda s: s["rows"][0].update(latency_s="fast"), "stored row 1 has latency_s 'fast'"),
    (lambda s: s["rows"].__setitem__(0, [1, 2]), "stored row 1 is a list"),
    (lambda s: s.update(api_base=5), "`api_base` is 5"),
    (lambda s: s.update(servers="abc"), "`servers` is not a list"),
    (lambda s: s.update(stop="</s>"), "`stop` is '</s>'"),
])
def test_other_edits_are_one_error_line(tmp_path, server, change, said):
    data, out, _ = first_run(tmp_path, server)
    edit(out, change)
    with pytest.raises(InputDataError, match="^" + str(out).replace(".", r"\.")):
        run_eval(EvalConfig(api_base=server.url, data=data, output=out))
    result = CliRunner().invoke(app, ["eval", "--api-base", server.url, "--data", str(data), "-o", str(out)])
    assert server.chat_bodies == []
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "".join(said.split()) in flat(result), result.output
    assert "--force" in flat(result)


@pytest.mark.parametrize("change", [
    lambda s: s["rows"][0].update(score="high"),
    lambda s: s["rows"][0].pop("task"),
    lambda s: s["rows"][0].pop("score"),
    lambda s: s["rows"][0].update(gold=None, extracted=5),
])
def test_fields_resume_does_not_read_back_are_recomputed(tmp_path, server, change):
    data, out, _ = first_run(tmp_path, server)
    edit(out, change)
    report = run_eval(EvalConfig(api_base=server.url, data=data, output=out))
    assert server.chat_bodies == []
    assert report["ori_accuracy"] == 100.0 and report["rows"][0]["task"] == "niah"
    assert report["rows"][0]["gold"] == ["x"]


def test_a_result_written_before_rows_had_a_key_is_resumed_under_its_header(tmp_path, server):
    data, out, _ = first_run(tmp_path, server, max_tokens=100)

    def legacy(saved):
        saved["version"] = 2
        for row in saved["rows"]:
            row.pop("key")
    edit(out, legacy)
    # no model dir then and now: only max_tokens can differ
    run_eval(EvalConfig(api_base=server.url, data=data, output=out, max_tokens=100))
    assert server.chat_bodies == []
    run_eval(EvalConfig(api_base=server.url, data=data, output=out, max_tokens=300))
    assert len(server.chat_bodies) == 4


def test_rows_outside_this_run_keep_their_own_key_and_stay(tmp_path, server):
    data, out, _ = first_run(tmp_path, server, max_tokens=100)
    run_eval(EvalConfig(api_base=server.url, data=data, output=out, max_tokens=200, rows=2))
    assert [b["max_tokens"] for b in server.chat_bodies] == [200, 200]  # only the two rows of this run
    saved = json.loads(out.read_text())
    assert [r["key"]["max_tokens"] for r in saved["rows"]] == [200, 200, 100, 100]  # merged, never truncated
