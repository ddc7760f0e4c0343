"""The input sweep of docs/input-sweep.md (issue 24): one test per defect row not already covered by
test_input_resume, test_input_files or test_input_errors; named test_row_ID_*, the ids of the table.

Bad input: exit 2, one `error:` line naming it, no traceback. Devices are read for real: their readers are capped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tiny_tokenizer import make_tiny_tokenizer
from soarpack.cli import app
from soarpack.errors import SoarpackError

LONG = " ".join(["word"] * 40)


def run_cli(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


class Child:
    """The result of `python -m soarpack` in a child, shaped like CliRunner's (output, exit_code, exception)."""

    def __init__(self, proc):
        self.output, self.exit_code, self.exception = proc.stdout + proc.stderr, proc.returncode, None


def limited_cli(cwd, *args) -> Child:
    """Run soarpack in a child with 3 GiB of address space: a reader without a cap fails there, not the test run.
    The child imports the soarpack of PYTHONPATH (it runs outside the checkout)."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
    return Child(subprocess.run([sys.executable, "-m", "soarpack", *map(str, args)], capture_output=True, text=True,
                                timeout=120, preexec_fn=limit, cwd=cwd))


def assert_one_error_line(result, *said: str) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "error:" in result.output
    flat = "".join(result.output.split())
    for text in said:
        assert "".join(str(text).split()) in flat, (text, result.output)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Path(make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "model", text=LONG))


def test_row_C1_calib_of_a_directory_says_directory_not_missing(tmp_path, tok):
    folder = tmp_path / "cal"
    folder.mkdir()
    assert_one_error_line(run_cli("calib", folder, "--model-dir", tok), "is a directory")


def test_row_C11_calib_write_builtin_to_a_directory_is_refused_up_front(tmp_path, tiny_model_dir):
    folder = tmp_path / "adir"
    folder.mkdir()
    result = run_cli("calib", "--model-dir", tiny_model_dir, "-n", "4", "--max-len", "64", "--write-builtin", folder)
    assert_one_error_line(result, "--write-builtin", "is a directory")
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("command", ["quantize", "build"])
def test_row_Q2_B5_recipe_from_a_device_is_one_error_line(tmp_path, tiny_model_dir, command):
    args = ([tiny_model_dir, tmp_path / "q"] if command == "quantize"
            else ["--no-wheels", "-o", tmp_path / "b.tar.gz"])
    result = limited_cli(tmp_path, command, *args, "--recipe", "/dev/zero")
    assert_one_error_line(result, "/dev/zero")


def test_row_V2_verify_of_a_quantize_config_that_is_a_list(tmp_path, tiny_model_dir):
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize

    ckpt = tmp_path / "q"
    quantize(tiny_model_dir, ckpt, quantize_options(rows=8, max_len=64))
    (ckpt / "quantize_config.json").write_text("[1, 2]")
    result = run_cli("verify", ckpt)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and "quantize_config.json: a JSON list" in result.output


@pytest.mark.parametrize("source", ["/dev/zero", "pipe"])
def test_row_B2_B3_build_calib_that_is_not_a_regular_file_says_so(tmp_path, source):
    if source == "pipe":
        read_fd, write_fd = os.pipe()
        os.close(write_fd)
        source = f"/dev/fd/{read_fd}"
    result = run_cli("build", "--no-wheels", "--calib", source, "-o", tmp_path / "b.tar.gz")
    assert_one_error_line(result, source, "is not a regular file")
    assert "does not exist" not in result.output


@pytest.mark.parametrize("variable", ["SOARPACK_CACHE", "XDG_CACHE_HOME", "HOME"])
def test_row_W1_W3_B7_a_cache_path_that_is_a_file_is_one_error_line(tmp_path, monkeypatch, variable):
    afile = tmp_path / "cachefile"
    afile.write_text("not a folder\n")
    for name in ("SOARPACK_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, str(afile))
    assert_one_error_line(run_cli("wheels", "fetch"), str(afile), "SOARPACK_CACHE")
    assert_one_error_line(run_cli("build", "-o", tmp_path / "b.tar.gz"), str(afile), "SOARPACK_CACHE")


def test_row_K6_check_with_a_cache_that_is_a_file_is_an_error_not_a_failed_bundle(tmp_path, monkeypatch):
    from soarpack.bundle.build import build_bundle

    bundle = build_bundle(tmp_path / "b.tar.gz", wheels=False, calib_rows=8).path
    afile = tmp_path / "cachefile"
    afile.write_text("not a folder\n")
    monkeypatch.setenv("SOARPACK_CACHE", str(afile))
    result = run_cli("check", bundle)
    assert_one_error_line(result, "image stand-in", str(afile))
    assert "NOTuploadable" not in "".join(result.output.split())


def test_row_I5_inspect_counts_rows_as_quantize_reads_them(tmp_path):
    from soarpack.bundle.build import build_bundle
    from soarpack.bundle.summary import inspect_bundle

    jsonl = tmp_path / "ls.jsonl"
    jsonl.write_text(json.dumps({"text": f"{LONG}\u2028{LONG}\u0085{LONG}"}, ensure_ascii=False) + "\n", encoding="utf-8")
    prose = tmp_path / "prose.txt"
    prose.write_text("one text file\nof three lines\nis one row\n")
    ndjson = tmp_path / "more.NDJSON"
    ndjson.write_text("".join(json.dumps({"text": f"{i} {LONG}"}) + "\n" for i in range(3)))
    bundle = build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[jsonl, prose, ndjson]).path
    rows = {Path(s["file"]).name: s["rows"] for s in inspect_bundle(bundle)["calibration"]["sources"]}
    assert rows == {"00-ls.jsonl": 1, "01-prose.txt": 1, "02-more.NDJSON": 3}


@pytest.mark.parametrize("command", ["eval", "bench"])
def test_row_E1_N2_data_that_is_a_directory_is_one_error_line(tmp_path, tok, command):
    folder = tmp_path / "data"
    folder.mkdir()
    args = (["--data", folder] if command == "eval" else ["--s1", folder, "--model-dir", tok])
    result = run_cli(command, "--api-base", "http://127.0.0.1:9", *args)
    assert_one_error_line(result, "is a directory")


def test_row_N1_bench_data_from_a_device_is_one_error_line(tmp_path, tok):
    result = limited_cli(tmp_path, "bench", "--api-base", "http://127.0.0.1:9", "--s1", "/dev/zero", "--model-dir", tok)
    assert_one_error_line(result, "/dev/zero", "NUL")


def test_row_N3_bench_data_with_a_line_separator_inside_a_question(tmp_path):
    from soarpack.measure.speed import load_speed_pairs

    data = tmp_path / "s.jsonl"
    data.write_text(json.dumps({"question": "a\u2028b\u0085c", "model_response": "d"}, ensure_ascii=False) + "\n",
                    encoding="utf-8")
    assert load_speed_pairs(data) == [("a\u2028b\u0085c", "d")]


@pytest.mark.parametrize("flag", ["--text", "--mix"])
def test_row_D1_D2_speedset_inputs_from_a_device_are_one_error_line(tmp_path, tok, flag):
    result = limited_cli(tmp_path, "speedset", "--model-dir", tok, "-n", "2", "-o", tmp_path / "s.jsonl", flag, "/dev/zero")
    assert_one_error_line(result, "/dev/zero")
    assert not (tmp_path / "s.jsonl").exists()


@pytest.mark.parametrize("args", [
    ["score", "--ours", "/dev/zero", "--best-s1", "1", "--best-s8", "1", "--best-smax", "1"],
    ["compare", "/dev/zero"],
], ids=["score", "compare"])
def test_row_R1_M1_results_from_a_device_are_one_error_line(tmp_path, args):
    assert_one_error_line(limited_cli(tmp_path, *args), "/dev/zero")


def test_row_H2_a_server_python_that_does_not_exist_is_one_error_line(tmp_path):
    from soarpack.serve.server import start_server

    with pytest.raises(SoarpackError, match="cannot start /nonexistent/python") as exc:
        start_server(["/nonexistent/python", "-m", "sglang.launch_server"], 39999, tmp_path / "server.log",
                     timeout_s=5)
    assert "--python" in exc.value.hint


@pytest.mark.parametrize("kind", ["device", "directory"])
def test_row_A2_S3_H3_a_profile_that_exists_but_is_no_file_says_what_it_is(tmp_path, kind):
    target = "/dev/zero" if kind == "device" else tmp_path / "profiles"
    if kind == "directory":
        target.mkdir()
    result = run_cli("args", target)
    assert_one_error_line(result, str(target), "larger than" if kind == "device" else "is a directory")
    assert "does not exist" not in result.output
