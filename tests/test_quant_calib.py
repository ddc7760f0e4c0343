"""Calibration: formats, left truncation, task stratification, seeding, and failing early on bad input."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.errors import ConfigError, InputDataError
from soarpack.quant.calib import (BUILTIN_TASKS, build_calibration, build_held_out, builtin_prompts, load_calibration,
                                  summarize, write_builtin_calibration)
from soarpack.sala.tokenizer import load_tokenizer
from soarpack.sala.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("calib") / "tiny", num_layers=2)


@pytest.fixture(scope="module")
def tok(tiny):
    return load_tokenizer(tiny)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_builtin_prompts_cover_every_task_and_are_seeded():
    a, b, c = builtin_prompts(20, seed=1), builtin_prompts(20, seed=1), builtin_prompts(20, seed=2)
    assert a == b and a != c
    assert Counter(r["task"] for r in a) == {t: 4 for t in BUILTIN_TASKS}
    mcq = [r for r in a if r["task"] == "mcq"]
    assert all("ANSWER: X" in r["question"] and r["gold"].split("ANSWER: ")[-1] in "ABCD" for r in mcq)
    niah = [r for r in a if r["task"] == "niah"]
    assert all(r["gold"] in r["question"] for r in niah)  # the needle really is in the haystack


def test_left_truncation_keeps_the_question_at_the_end(tmp_path, tok):
    long_q = " ".join(["filler"] * 400) + " QUESTION what is the magic number"
    f = write_jsonl(tmp_path / "c.jsonl", [{"text": long_q}])
    rows = build_calibration([f], tok, rows=1, max_len=32, seed=0)
    assert len(rows[0].ids) == 32 and rows[0].truncated
    assert tok.decode(rows[0].ids).rstrip().endswith("what is the magic number")
    full = tok.encode(long_q)
    assert rows[0].ids == full[-32:]


def test_soar_rows_are_rendered_with_the_chat_template(tmp_path, tok):
    f = write_jsonl(tmp_path / "s.jsonl", [{"question": "where is the apple", "task": "qa", "gold": "river"}])
    ids = load_calibration([f], tok, rows=1, max_len=512, seed=0)[0]
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>user\nwhere is the apple<|im_end|>")
    assert "<|im_start|>assistant\n" in text and text.endswith("river")


def test_messages_rows_and_text_files(tmp_path, tok):
    f = write_jsonl(tmp_path / "m.jsonl", [{"messages": [{"role": "user", "content": "hello there"},
                                                          {"role": "assistant", "content": "general apple"}]}])
    txt = tmp_path / "doc.txt"
    txt.write_text("the model reads long documents and answers questions about needles")
    rows = build_calibration([f, txt], tok, rows=10, max_len=512, seed=0)
    assert sorted(r.task for r in rows) == ["chat", "text"]
    chat = next(r for r in rows if r.task == "chat")
    assert "<|im_start|>assistant\ngeneral apple<|im_end|>" in tok.decode(chat.ids)


def test_rows_are_stratified_by_task(tmp_path, tok):
    data = ([{"text": f"apple river {i} mountain seven", "task": "big"} for i in range(90)]
            + [{"text": f"orange window {i} garden silver", "task": "small"} for i in range(10)])
    f = write_jsonl(tmp_path / "mix.jsonl", data)
    rows = build_calibration([f], tok, rows=20, max_len=64, seed=3)
    assert Counter(r.task for r in rows) == {"big": 10, "small": 10}
    again = build_calibration([f], tok, rows=20, max_len=64, seed=3)
    assert [r.ids for r in rows] == [r.ids for r in again]


def test_a_broken_line_names_the_file_and_line(tmp_path, tok):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "fine text here for sure"}\n{"text": broken\n')
    with pytest.raises(InputDataError, match=r"bad\.jsonl:2"):
        load_calibration([f], tok, rows=4, max_len=64, seed=0)
    f.write_text('{"nothing": 1}\n')
    with pytest.raises(InputDataError, match=r"bad\.jsonl:1.*question"):
        load_calibration([f], tok, rows=4, max_len=64, seed=0)


def test_max_len_must_stay_under_dense_len(tok):
    with pytest.raises(ConfigError, match="dense_len"):
        load_calibration(None, tok, rows=2, max_len=8192, seed=0, dense_len=8192)
    assert len(load_calibration(None, tok, rows=2, max_len=8191, seed=0, dense_len=8192)) == 2


def test_summary_and_written_builtin_file(tmp_path, tok):
    path = write_builtin_calibration(tmp_path / "calib.jsonl", n=10, seed=4, max_len=128)
    # The shipped file holds exactly the rows a local run with the same settings generates.
    assert build_calibration([path], tok, rows=10, max_len=128, seed=4) == build_calibration(None, tok, rows=10, max_len=128, seed=4)
    rows = build_calibration([path], tok, rows=10, max_len=128, seed=0)
    s = summarize(rows, 128)
    assert s["rows"] == 10 and sum(s["length_histogram"].values()) == 10
    assert s["tasks"] == {t: 2 for t in BUILTIN_TASKS}
    assert s["truncated"] == sum(r.truncated for r in rows)


def test_calib_cli_preview(tiny):
    res = CliRunner().invoke(app, ["calib", "--model-dir", str(tiny), "--rows", "10", "--max-len", "256", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["rows"] == 10 and set(out["tasks"]) == set(BUILTIN_TASKS)
    res = CliRunner().invoke(app, ["calib", "--model-dir", str(tiny), "--max-len", "9000"])
    assert res.exit_code == 2 and "dense_len" in res.output
    res = CliRunner().invoke(app, ["calib", "--tokenizer", str(tiny), "--rows", "3", "--max-len", "256"])
    assert res.exit_code == 0 and "--tokenizer is now --model-dir" in res.output  # the old spelling, hidden, for a release


def test_held_out_rows_never_calibration_rows(tmp_path, tok):
    calib = build_calibration(None, tok, rows=12, max_len=128, seed=0)
    held = build_held_out(None, tok, rows=4, max_len=128, seed=0, calibration=calib)
    assert len(held) == 4 and not {tuple(r.ids) for r in held} & {tuple(r.ids) for r in calib}
    both = write_builtin_calibration(tmp_path / "both.jsonl", n=12, seed=0, max_len=128)
    with pytest.raises(InputDataError, match="held-out row 1 is also a calibration row"):
        build_held_out([both], tok, rows=1, max_len=128, seed=0, calibration=build_calibration([both], tok, rows=12, max_len=128, seed=0))
