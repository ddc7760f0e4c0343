"""Issue 24, input files: calibration and data files are read for what they hold, under a size cap.

JSONL is recognised by content as well as by suffix (any case, `.ndjson`); empty and whitespace-only rows are
refused with their line; a device (`/dev/zero`, `/dev/urandom`) ends in one error line, a pipe (`/dev/fd/N`) is
input like a file; U+2028 and U+0085 inside a JSON string are text; a tokenizer larger than config.json's
vocab_size is refused before any work; a chat template that raises is one error line.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import ChatReply, FakeSGLang
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.measure.evaluate import EvalConfig, load_eval_rows, run_eval
from soarpack.measure.jsonl import read_jsonl
from soarpack.cli import app
from soarpack.errors import InputDataError
from soarpack.quant.calib import read_examples

LONG = " ".join(["word"] * 40)  # enough tokens for a calibration row with the word-level test tokenizer


def rows_jsonl(n: int = 3) -> str:
    return "".join(json.dumps({"text": f"row {i} {LONG}"}) + "\n" for i in range(n))


def run_cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_one_error_line(result, *said: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    flat = "".join(result.output.split())
    assert "error:" in result.output
    for text in said:
        assert "".join(text.split()) in flat, (text, result.output)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Path(make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "model", text=LONG))


# -- JSONL by content as well as suffix ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cal.JSONL", "cal.Jsonl", "cal.ndjson", "cal.txt", "cal"])
def test_jsonl_is_recognised_by_suffix_in_any_case_and_by_content(tmp_path, name):
    path = tmp_path / name
    path.write_text(rows_jsonl(3))
    examples = read_examples(path)
    assert len(examples) == 3  # not one row of raw JSON
    assert examples[0].text == f"row 0 {LONG}"


def test_calib_cli_counts_the_rows_of_an_ndjson_file(tmp_path, tok):
    path = tmp_path / "mine.ndjson"
    path.write_text(rows_jsonl(5))
    result = run_cli("calib", path, "--model-dir", tok, "-n", "8", "--max-len", "64", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"] == 5


def test_prose_that_starts_with_a_brace_stays_one_text_row(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("{not json} but prose\nand more prose\n")
    assert [e.text for e in read_examples(path)] == ["{not json} but prose\nand more prose\n"]


# -- empty and whitespace-only rows ----------------------------------------------------------------------------


@pytest.mark.parametrize("row, field", [
    ({"text": "   \t "}, "text"),
    ({"question": " \n ", "task": "mcq", "gold": "A"}, "question"),
    ({"messages": [{"role": "user", "content": "\u3000 "}]}, "messages[0].content"),
])
def test_whitespace_only_calibration_rows_are_refused_with_their_line(tmp_path, row, field):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": f"fine {LONG}"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(InputDataError, match="only whitespace") as exc:
        read_examples(path)
    assert "c.jsonl:2" in exc.value.message and field in exc.value.message


@pytest.mark.parametrize("question", ["", "   ", "\n\t"])
def test_empty_or_whitespace_eval_questions_are_refused_before_any_request(tmp_path, question):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"task": "mcq", "question": "fine", "gold": "A"}) + "\n"
                    + json.dumps({"task": "mcq", "question": question, "gold": "A"}) + "\n")
    with pytest.raises(InputDataError, match="empty or only whitespace") as exc:
        load_eval_rows(data)
    assert f"{data}:2" in exc.value.message


# -- devices and pipes -----------------------------------------------------------------------------------------


def _limited(args, cwd, timeout=120):
    """Run soarpack in a child with 3 GiB of address space, so a reader without a cap fails instead of the host.
    The child imports the soarpack of PYTHONPATH (it runs outside the checkout)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "soarpack", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, cwd=cwd)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_eval_data_is_one_error_line(tmp_path, device):
    proc, seconds = _limited(["eval", "--api-base", "http://127.0.0.1:9", "--data", device], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "error:" in proc.stderr
    assert device in proc.stderr and seconds < 60


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_calibration_is_refused_for_what_it_holds(device):
    with pytest.raises(InputDataError) as exc:
        read_examples(device)
    # Refused as binary data, not "does not exist" (it exists) and not after reading to memory's end.
    assert "does not exist" not in exc.value.message
    assert "not text" in exc.value.message or "not UTF-8" in exc.value.message


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_calibration_in_the_cli_is_one_error_line(tmp_path, tok, device):
    proc, seconds = _limited(["calib", device, "--model-dir", tok, "-n", "4", "--max-len", "64"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "does not exist" not in proc.stderr and seconds < 60


def test_a_file_over_the_cap_is_refused_with_its_cap(tmp_path, monkeypatch):
    import soarpack.inputs as inputs

    big = tmp_path / "big.jsonl"
    big.write_text(rows_jsonl(400))
    monkeypatch.setattr(inputs, "CHUNK", 4096)
    from soarpack.measure import jsonl

    monkeypatch.setattr(jsonl, "MAX_DATA_BYTES", 8192)
    with pytest.raises(InputDataError, match="larger than soarpack's cap"):
        read_jsonl(big)


def test_a_line_without_end_is_refused_at_the_line_cap(tmp_path, monkeypatch):
    import soarpack.inputs as inputs

    endless = tmp_path / "one.jsonl"
    endless.write_text('{"text": "' + "x" * 50_000)
    monkeypatch.setattr(inputs, "CHUNK", 4096)
    monkeypatch.setattr(inputs, "MAX_LINE_BYTES", 10_000)
    with pytest.raises(InputDataError, match="line 1 is longer than"):
        list(inputs.iter_lines(endless, "data file", 10**9, max_line=10_000))


def _pipe(payload: bytes) -> str:
    read_fd, write_fd = os.pipe()

    def feed():
        with os.fdopen(write_fd, "wb") as fh:
            fh.write(payload)
    threading.Thread(target=feed, daemon=True).start()
    return f"/dev/fd/{read_fd}"


def test_a_pipe_is_calibration_input(tmp_path):
    path = _pipe(rows_jsonl(3).encode())
    try:
        examples = read_examples(path)
    finally:
        os.close(int(path.rsplit("/", 1)[1]))
    # No suffix: recognised as JSONL by its content, read once as a stream.
    assert len(examples) == 3


def test_a_pipe_is_eval_data(tmp_path):
    path = _pipe(b'{"task": "niah", "question": "q0", "gold": ["x"]}\n')
    with FakeSGLang(chat=lambda q: ChatReply("</think>x")) as server:
        try:
            report = run_eval(EvalConfig(api_base=server.url, data=Path(path), output=None))
        finally:
            os.close(int(path.rsplit("/", 1)[1]))
    assert report["scored"] == 1 and report["ori_accuracy"] == 100.0


# -- line separators inside strings ----------------------------------------------------------------------------


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\u0085"])
def test_unicode_line_separators_inside_a_json_string_are_text(tmp_path, char):
    data = tmp_path / "d.jsonl"
    question = f"first part{char}second part"
    # ensure_ascii=False: the raw character sits inside the JSON string, as a UTF-8 JSONL writer leaves it
    data.write_text(json.dumps({"task": "niah", "question": question, "gold": ["x"]}, ensure_ascii=False) + "\n"
                    + json.dumps({"task": "niah", "question": "q1", "gold": ["x"]}) + "\n", encoding="utf-8")
    rows = load_eval_rows(data)
    assert [r["question"] for r in rows] == [question, "q1"]
    calib = tmp_path / "c.jsonl"
    calib.write_text(json.dumps({"text": f"{LONG}{char}{LONG}"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read_examples(calib)[0].text == f"{LONG}{char}{LONG}"


# -- the tokenizer and its chat template ---------------------------------------------------------------------


def _model_with_template(tmp_path: Path, tok: Path, template: str) -> Path:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tok, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize("template", [
    "{{ raise_exception('this template refuses every conversation') }}",
    "{% for m in messages %}{{ m['content'] | no_such_filter }}{% endfor %}",
    "{{ messages[5]['content'].upper() }}",
])
def test_a_chat_template_that_raises_is_one_error_line(tmp_path, tok, template):
    model = _model_with_template(tmp_path, tok, template)
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"task": "mcq", "question": f"pick {LONG}", "gold": "A"}) + "\n")
    result = run_cli("calib", data, "--model-dir", model, "-n", "2", "--max-len", "64")
    assert_one_error_line(result, "q.jsonl:1", "chat template")


@pytest.mark.needs_torch
def test_a_tokenizer_larger_than_vocab_size_is_refused_before_any_work(tiny_model_dir, tmp_path, monkeypatch):
    import shutil

    from transformers import AutoTokenizer

    from soarpack.quant import run as quant_run

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(vocab_size - len(tokenizer) + 5)])
    tokenizer.save_pretrained(str(model))
    assert len(AutoTokenizer.from_pretrained(str(model))) > vocab_size

    def no_work(*args, **kwargs):
        raise AssertionError("calibration started: the mismatch was not found before any work")
    monkeypatch.setattr(quant_run, "prepare_calibration", no_work)
    result = run_cli("quantize", model, tmp_path / "q")
    assert_one_error_line(result, "vocab_size", str(vocab_size))
    calib = run_cli("calib", "--model-dir", model, "-n", "2", "--max-len", "64")
    assert_one_error_line(calib, "vocab_size")
