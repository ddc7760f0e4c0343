"""Security sweep 2026-12-01 (issue 20): one test per hole, named test_case_N_*, N the issue's numbering.

1. secrets behind a JSON escape, in wheel members, base64-encoded; 2. code a server chooses; 3. server args the
platform's shell splits; 4. unbounded replies; 5. control characters printed raw. Servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shlex
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import MAX_HOLD_S, ChatReply, FakeSGLang, GenerateScript
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.measure.client import make_client, stream_generate
from soarpack.measure.evaluate import EvalConfig, run_eval
from soarpack.measure.speed import BenchConfig, run_bench
from soarpack.bundle.build import build_bundle
from soarpack.rehearse.check import check_bundle
from soarpack.steps import FAIL
from soarpack.bundle.secrets import CredentialError, find_secret, scan_tree
from soarpack.bundle.tarpack import pack_tree, safe_extract
from soarpack.cli import app
from soarpack.errors import ConfigError, SoarpackError
from soarpack.serve.lint import lint_args
from soarpack.recipe.profile import list_profiles, load_profile

QUIET = dict(calib_rows=8)
HF_TOKEN = "hf_" + "Ab3" * 12
GH_TOKEN = "ghp_" + "B7x" * 12
AWS_KEY = "AKIA" + "QX3Z7" * 3 + "Q"
# An OpenSSH private key's PEM armour and the start of its body (made up: the scanner reads the shape, not the key).
PEM_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
           "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZWQy\n"
           "-----END OPENSSH PRIVATE KEY-----\n")
B64_KEY = base64.b64encode(PEM_KEY.encode()).decode()

# The shapes of issue 20, case 1, as calibration rows: each is one JSONL line as json.dumps writes it.
JSON_SHAPES = {
    "hf-after-newline": {"text": f"my token is:\n{HF_TOKEN}"},
    "akia-after-tab": {"text": f"aws key\t{AWS_KEY}\tregion eu-west-1"},
    "ghp-own-line-chat": {"messages": [{"role": "user", "content": f"my token:\n{GH_TOKEN}\nkeep it safe"},
                                       {"role": "assistant", "content": "ok"}]},
    "hf-unicode-escaped": {"text": "tok " + "".join(f"\\u{ord(c):04x}" for c in HF_TOKEN)},
    "base64-private-key": {"text": f"deploy key: {B64_KEY}"},
    "aws-secret-in-nested-json": {"text": json.dumps({"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"})},
}
WHAT = {"hf-after-newline": "Hugging Face token", "akia-after-tab": "AWS access key", "ghp-own-line-chat": "GitHub token",
        "hf-unicode-escaped": "Hugging Face token", "base64-private-key": "private key",
        "aws-secret-in-nested-json": "AWS secret access key"}


def _jsonl(path: Path, row: dict) -> Path:
    text = json.dumps(row)
    if "\\\\u" in text:  # the escaped-token row: write the escapes themselves, so only a JSON decoder sees the token
        text = text.replace("\\\\u", "\\u")
    path.write_text(text + "\n")
    return path


def test_case_1_json_rows_really_hide_the_token_from_a_word_boundary():
    """The rows are what the issue shipped: the token follows the letter of a JSON escape."""
    raw = json.dumps(JSON_SHAPES["hf-after-newline"])
    assert f"\\n{HF_TOKEN}" in raw
    assert f"\\t{AWS_KEY}" in json.dumps(JSON_SHAPES["akia-after-tab"])
    assert f"\\n{GH_TOKEN}\\n" in json.dumps(JSON_SHAPES["ghp-own-line-chat"])


@pytest.mark.parametrize("shape", sorted(JSON_SHAPES))
def test_case_1_build_refuses_each_shape(tmp_path, shape):
    calib = _jsonl(tmp_path / f"{shape}.jsonl", JSON_SHAPES[shape])
    with pytest.raises(CredentialError, match=WHAT[shape]) as exc:
        build_bundle(tmp_path / "out" / "b.tar.gz", wheels=False, calib=[calib], **QUIET)
    assert f"calib/00-{shape}.jsonl" in exc.value.message
    assert not (tmp_path / "out" / "b.tar.gz").exists()


@pytest.fixture(scope="module")
def clean_tree(tmp_path_factory):
    work = tmp_path_factory.mktemp("sec-check")
    bundle = build_bundle(work / "clean.tar.gz", wheels=False, **QUIET).path
    return safe_extract(bundle, work / "tree")


@pytest.mark.parametrize("shape", sorted(JSON_SHAPES))
def test_case_1_check_fails_credentials_for_each_shape(tmp_path, clean_tree, shape):
    """A tarball made by hand (not by build) with the row in it: check's credentials step fails, naming the file."""
    root = tmp_path / "bundle"
    pack_tree(clean_tree, tmp_path / "clean.tar.gz")
    safe_extract(tmp_path / "clean.tar.gz", root)
    _jsonl(root / "calib" / "01-leak.jsonl", JSON_SHAPES[shape])
    report = check_bundle(pack_tree(root, tmp_path / "leak.tar.gz"), rehearse=False)
    step = next(s for s in report.steps if s.name == "credentials")
    assert step.status == FAIL and "calib/01-leak.jsonl" in step.detail and WHAT[shape] in step.detail, step.detail


def test_case_1_base64_private_key_in_plain_text_and_wrapped(tmp_path):
    wrapped = base64.encodebytes(PEM_KEY.encode())  # 76-character lines, as `base64` writes them
    assert b"\n" in wrapped.strip()
    for data in (B64_KEY.encode(), wrapped, base64.urlsafe_b64encode(PEM_KEY.encode()), b"key=" + B64_KEY[:-2].encode()):
        assert "private key" in (find_secret(data) or ""), data[:40]
    body = "".join(PEM_KEY.splitlines()[1:-1])  # the armour's body alone: an OpenSSH key blob, base64
    assert "private key" in (find_secret(body.encode()) or "")
    (tmp_path / "notes.txt").write_bytes(b"notes\n" + wrapped)
    with pytest.raises(CredentialError, match="private key"):
        scan_tree(tmp_path)


def _wheel(path: Path, members: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


@pytest.mark.parametrize("member, body, what", [
    ("evil-1.0.dist-info/METADATA",
     'Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n\nConfigure it with {"env": {"token": "x\\n' + HF_TOKEN + '"}}\n',
     "Hugging Face token"),
    ("evil.pth", f"import os; os.environ.setdefault('K', '{B64_KEY}')\n", "private key"),
    ("evil/data.json", json.dumps({"rows": [{"t": "a\tb\n" + AWS_KEY}]}), "AWS access key"),
], ids=["metadata", "pth", "json-member"])
def test_case_1_every_wheel_member_is_scanned(tmp_path, member, body, what):
    _wheel(tmp_path / "wheels" / "evil-1.0-py3-none-any.whl", {"evil/__init__.py": "", member: body})
    with pytest.raises(CredentialError, match=what) as exc:
        scan_tree(tmp_path)
    assert f"evil-1.0-py3-none-any.whl!{member}" in exc.value.message


@pytest.mark.parametrize("text", [
    "the word \\nhf_tokenizer and \\tAKIA alone",  # escapes before token-like words that are not tokens
    json.dumps({"sha256": "ab" * 32, "text": "hf_quantizer_config = hf_Config"}),
    base64.b64encode(b"-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n").decode(),
    "A" * 200,
])
def test_case_1_near_misses_still_pass(tmp_path, text):
    assert find_secret(text.encode()) is None
    (tmp_path / "calib").mkdir()
    (tmp_path / "calib" / "00-ok.jsonl").write_text(json.dumps({"text": text}) + "\n")
    scan_tree(tmp_path)


# -- 2: code a server chooses -------------------------------------------------------------------------------------


def _folder_with_tokenizer_code(folder: Path, marker: Path) -> Path:
    """A tokenizer folder whose tokenizer_config points at its own tokenization_*.py, which writes `marker` when
    imported (what a hostile folder would do instead)."""
    make_tiny_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_marker.MarkerTokenizer"]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_marker.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\n\n\nclass MarkerTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    return folder


def _speed_rows(path: Path) -> Path:
    path.write_text("".join(json.dumps({"question": f"row {i} the river town", "model_response": "tok tok tok"}) + "\n"
                            for i in range(2)))
    return path


def _cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_case_2_bench_never_loads_the_tokenizer_a_server_names(tmp_path):
    marker = tmp_path / "MARKER"
    folder = _folder_with_tokenizer_code(tmp_path / "served", marker)
    data = _speed_rows(tmp_path / "s1.jsonl")
    with FakeSGLang(model_id=str(folder)) as server:
        result = _cli("bench", "--api-base", server.url, "--s1", data, "-o", tmp_path / "b.json", "--settle", "0")
    assert not marker.exists(), "the server-named folder's code ran"
    assert result.exit_code == 2 and "--model-dir" in result.output, result.output
    assert server.generate_bodies == []


def test_case_2_a_named_folder_runs_no_code_without_the_flag(tmp_path):
    marker = tmp_path / "MARKER"
    folder = _folder_with_tokenizer_code(tmp_path / "mine", marker)
    data = _speed_rows(tmp_path / "s1.jsonl")
    rows = tmp_path / "eval.jsonl"
    rows.write_text(json.dumps({"task": "mcq", "question": "q0", "gold": "B"}) + "\n")
    with FakeSGLang(model_id=str(folder), chat=lambda q: ChatReply("</think>ANSWER: B")) as server:
        bench = _cli("bench", "--api-base", server.url, "--model-dir", folder, "--s1", data, "-o", tmp_path / "b.json",
                     "--settle", "0")
        evaluation = _cli("eval", "--api-base", server.url, "--model-dir", folder, "--data", rows,
                          "-o", tmp_path / "e.json")
    speedset = _cli("speedset", "--model-dir", folder, "-n", "2", "-o", tmp_path / "speed.jsonl")
    assert bench.exit_code == 0, bench.output
    assert evaluation.exit_code == 0, evaluation.output
    assert speedset.exit_code == 0, speedset.output
    assert not marker.exists()


def test_case_2_remote_code_runs_only_with_the_users_flag(tmp_path):
    """The control: the same folder with --trust-remote-code does import its code (so the marker can appear)."""
    from soarpack.measure.tokenizer import load_tokenizer

    marker = tmp_path / "MARKER"
    folder = _folder_with_tokenizer_code(tmp_path / "trusted", marker)
    load_tokenizer(folder)
    assert not marker.exists()
    assert load_tokenizer(folder, trust_remote_code=True).encode("tok tok") == load_tokenizer(folder).encode("tok tok")
    assert marker.read_text() == "ran"


# -- 3: server args the platform's shell splits ------------------------------------------------------------------

UNSAFE_EXAMPLES = {"name-with-space": ["--served-model-name", "my model"],
                   "glob-template": ["--chat-template", "templates/*.jinja"]}


def _launch_through_a_shell(tmp_path: Path, mode: str, args_string: str) -> list:
    """Run the platform's launch line (PLATFORM_LAUNCH_LINE) under `mode` against a stand-in `python` on PATH that
    records its argv; return that argv. The folder holds templates/a.jinja, so a glob has something to match."""
    from soarpack.serve.server import PLATFORM_LAUNCH_LINE

    bin_dir, record = tmp_path / "bin", tmp_path / f"argv-{mode}.json"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "python"
    stand_in.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        "json.dump(sys.argv[1:], open(os.environ['ARGV_RECORD'], 'w'))\n")
    stand_in.chmod(0o755)
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "a.jinja").write_text("{{ messages }}")
    shells = {"bash": ["bash", "--noprofile", "--norc", "-c", PLATFORM_LAUNCH_LINE],
              "sh": ["sh", "-c", PLATFORM_LAUNCH_LINE],
              "eval": ["bash", "--noprofile", "--norc", "-c", f'eval "{PLATFORM_LAUNCH_LINE}"']}
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": "/models/q", "SGLANG_SERVER_ARGS": args_string,
           "ARGV_RECORD": str(record)}
    subprocess.run(shells[mode], env=env, cwd=tmp_path, check=True, timeout=30)
    return json.loads(record.read_text())


@pytest.mark.parametrize("mode", ["bash", "sh", "eval"])
@pytest.mark.parametrize("name", list_profiles())
def test_case_3_a_profiles_args_arrive_intact_through_the_platform_launch_line(tmp_path, name, mode):
    from soarpack.serve.server import launch_command

    prof = load_profile(name)
    assert [f for f in lint_args(prof.args) if f.rule == "unsafe-token"] == []
    argv = _launch_through_a_shell(tmp_path, mode, prof.args_string())
    assert argv == launch_command("/models/q", prof.args, 30000, "python")[1:]


@pytest.mark.parametrize("example", sorted(UNSAFE_EXAMPLES))
def test_case_3_unsafe_args_break_in_the_shell_and_lint_refuses_them(tmp_path, example):
    args = UNSAFE_EXAMPLES[example]
    got = {mode: _launch_through_a_shell(tmp_path, mode, shlex.join(args)) for mode in ("bash", "sh", "eval")}
    # what the issue saw: under the platform's unquoted expansion the server gets other words (`'my`, `model'`;
    # the template with its quotes), and `eval` gets yet another reading
    assert got["bash"][7:-5] != args and got["sh"][7:-5] != args and got["eval"] != got["bash"], got
    findings = [f for f in lint_args(args) if f.rule == "unsafe-token"]
    assert len(findings) == 1 and findings[0].level == "error"
    assert "\n" not in findings[0].message and args[1] in findings[0].message
    assert [f.rule for f in lint_args(shlex.join(args)) if f.rule == "unsafe-token"]  # the string form too


def _profile_with(tmp_path: Path, extra: list) -> Path:
    path = tmp_path / "unsafe-profile.toml"
    args = load_profile("safe").args + extra
    path.write_text(f'recipe = "w4-mlp"\n\n[serve]\nargs = {json.dumps(args)}\n')
    return path


@pytest.mark.parametrize("example", sorted(UNSAFE_EXAMPLES))
def test_case_3_args_and_build_refuse_the_examples(tmp_path, example):
    profile = _profile_with(tmp_path, UNSAFE_EXAMPLES[example])
    result = _cli("args", profile)
    assert result.exit_code == 2 and "unsafe-token" in result.output, result.output
    with pytest.raises(ConfigError, match="unsafe-token"):
        build_bundle(tmp_path / "b.tar.gz", profile=str(profile), wheels=False, **QUIET)
    assert not (tmp_path / "b.tar.gz").exists()


@pytest.mark.parametrize("example", sorted(UNSAFE_EXAMPLES))
def test_case_3_check_fails_args_lint_on_the_examples(tmp_path, clean_tree, example):
    root = tmp_path / "bundle"
    pack_tree(clean_tree, tmp_path / "clean.tar.gz")
    safe_extract(tmp_path / "clean.tar.gz", root)
    from soarpack.bundle.manifest import render_bundle_env, render_manifest

    # A bundle whose args were edited consistently (MANIFEST, its args_string and bundle.env agree), so that
    # only the lint can refuse it.
    meta = {k: v for k, v in json.loads((root / "MANIFEST.json").read_text()).items()
            if k not in ("format", "files", "total_size")}
    meta["profile"]["args"] += UNSAFE_EXAMPLES[example]
    meta["profile"]["args_string"] = shlex.join(meta["profile"]["args"])
    (root / "bundle.env").write_text(render_bundle_env(render_manifest(None, meta)))
    (root / "MANIFEST.json").write_text(json.dumps(render_manifest(root, meta).as_json()))
    report = check_bundle(pack_tree(root, tmp_path / "args.tar.gz"), rehearse=False)
    assert next(s for s in report.steps if s.name == "structure").status == "pass"
    step = next(s for s in report.steps if s.name == "args lint")
    assert step.status == FAIL and "unsafe-token" in step.detail, step.detail


# -- 4: unbounded replies ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("sec-tok"))


def _eval_rows(path: Path, n: int = 1) -> Path:
    path.write_text("".join(json.dumps({"task": "mcq", "question": f"q{i}", "gold": "B"}) + "\n" for i in range(n)))
    return path


def test_case_4_a_chunk_claiming_1e9_tokens_is_capped_at_max_new_tokens(tmp_path, tokenizer_dir):
    """The issue's chunk: completion_tokens 10**9 made bench build a 10**9-element ITL list (8 GB)."""
    data = _speed_rows(tmp_path / "s1.jsonl")  # 3 output tokens per row
    with FakeSGLang(generate=GenerateScript(claim_tokens=10**9)) as server:
        report = run_bench(BenchConfig(api_base=server.url, tiers={"s1": data}, model_dir=Path(tokenizer_dir),
                                       settle_s=0.0, warmup=False))
    tier = report["tiers"]["s1"]
    assert tier["completed"] == 2 and tier["failed"] == 0
    assert tier["total_output_tokens"] == tier["requested_output_tokens"] == 6


def test_case_4_stream_generate_keeps_every_claim_within_the_request(tmp_path):
    async def one(url):
        async with make_client(url, None, 10.0) as client:
            return await stream_generate(client, "row", 5)

    with FakeSGLang(generate=GenerateScript(claim_tokens=10**9)) as server:
        result = asyncio.run(one(server.url))
    assert result.success and result.output_tokens == 5 and len(result.itl_s) <= 5


def test_case_4_chat_usage_counts_are_capped(tmp_path):
    data = _eval_rows(tmp_path / "d.jsonl")
    with FakeSGLang(chat=lambda q: ChatReply("</think>ANSWER: B", completion_tokens=10**9)) as server:
        report = run_eval(EvalConfig(api_base=server.url, data=data, max_tokens=100))
    assert report["rows"][0]["output_tokens"] == 100 and report["rows"][0]["score"] == 1.0


def test_case_4_a_trickling_reply_is_cut_at_the_deadline(tmp_path):
    """One byte a second passes --timeout 3 and --stall-timeout 3 (each read is quick); --deadline 2 ends it."""
    data = _eval_rows(tmp_path / "d.jsonl")
    with FakeSGLang(chat=lambda q: ChatReply("</think>ANSWER: B", trickle_s=1.0)) as server:
        started = time.monotonic()
        result = _cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json",
                      "--timeout", "3", "--stall-timeout", "3", "--deadline", "2")
        elapsed = time.monotonic() - started
    assert result.exit_code == 1, result.output  # incomplete: the row failed
    _row = json.loads((tmp_path / "e.json").read_text())["rows"][0]
    # uncut, the reply trickles until the server drops it after MAX_HOLD_S: a causal bound, not a speed
    assert elapsed < MAX_HOLD_S, (elapsed, _row["error"], _row["latency_s"], result.output)
    row = json.loads((tmp_path / "e.json").read_text())["rows"][0]
    assert row["error"] == "deadline: no complete reply within 2 s" and row["score"] == 0
    assert EvalConfig(api_base="http://x", data=data).deadline_s is None  # off by default: rows score as on the platform


def test_case_4_a_slow_stream_is_cut_at_the_bench_deadline(tmp_path, tokenizer_dir):
    data = tmp_path / "s1.jsonl"
    data.write_text(json.dumps({"question": "row the river town", "model_response": " ".join(["tok"] * 20)}) + "\n")
    with FakeSGLang(generate=GenerateScript(token_delay_s=1.0)) as server:
        started = time.monotonic()
        report = run_bench(BenchConfig(api_base=server.url, tiers={"s1": data}, model_dir=Path(tokenizer_dir),
                                       settle_s=0.0, warmup=False, stall_s=3.0, deadline_s=2.0))
        elapsed = time.monotonic() - started
    tier = report["tiers"]["s1"]
    assert tier["failed"] == 1 and tier["errors"] == ["deadline: no complete reply within 2 s"]
    assert elapsed < 19 * 1.0, elapsed  # uncut, the 20 tokens take 19 gaps of 1 s: a causal bound, not a speed


def test_case_4_bodies_lines_and_ids_are_bounded(tmp_path, monkeypatch, tokenizer_dir):
    from soarpack.measure import client

    monkeypatch.setattr(client, "MAX_REPLY_BYTES", 1024)
    monkeypatch.setattr(client, "MAX_LINE_BYTES", 1024)
    data = _eval_rows(tmp_path / "d.jsonl", 2)
    replies = {"q0": ChatReply("</think>" + "B" * 4096), "q1": ChatReply(status=500, raw=b"x" * 100_000)}
    with FakeSGLang(chat=lambda q: replies[q]) as server:
        rows = run_eval(EvalConfig(api_base=server.url, data=data))["rows"]
    assert rows[0]["error"] == "the reply larger than 1024 bytes"
    assert rows[1]["error"] == "HTTP 500: (an error body larger than 4 KiB)"
    speed = tmp_path / "s1.jsonl"
    speed.write_text(json.dumps({"question": "row the river town", "model_response": " ".join(["tok"] * 400)}) + "\n")
    with FakeSGLang(generate=GenerateScript(tokens_per_chunk=400)) as server:  # one line of ~1.6 kB
        tier = run_bench(BenchConfig(api_base=server.url, tiers={"s1": speed}, model_dir=Path(tokenizer_dir),
                                     settle_s=0.0, warmup=False))["tiers"]["s1"]
    assert tier["errors"] == ["a stream line larger than 1024 bytes"]
    with FakeSGLang(model_id="m" * 5000) as server:
        with pytest.raises(SoarpackError, match="longer than 4096 characters"):
            run_eval(EvalConfig(api_base=server.url, data=data))


# -- 5: control characters printed raw ---------------------------------------------------------------------------

ESC_TITLE = "\x1b]0;pwned\x07\x1b[2J"  # retitle the terminal window, then clear the screen
ESC_TITLE_PRINTED = "\\x1b]0;pwned\\x07\\x1b[2J"


def _assert_escaped(output: str) -> None:
    assert "\x1b" not in output and "\x07" not in output, repr(output)
    assert ESC_TITLE_PRINTED in output, output


def test_case_5_printable_escapes_controls_only():
    from soarpack.printable import printable

    assert printable(f"a{ESC_TITLE}b") == "a\\x1b]0;pwned\\x07\\x1b[2Jb"
    assert printable("ok\u202ecod.exe\r\x9b") == "ok\\u202ecod.exe\\r\\x9b"
    assert printable("línea 1\nlínea 2", keep="\n") == "línea 1\nlínea 2"
    assert printable("C:\\models\\q [x]") == "C:\\models\\q [x]"


def test_case_5_an_escape_sequence_in_a_file_name_is_printed_escaped(tmp_path):
    calib = tmp_path / f"evil{ESC_TITLE}.jsonl"
    calib.write_text(json.dumps({"text": f"key {HF_TOKEN}"}) + "\n")
    result = _cli("build", "--no-wheels", "--calib", calib, "-o", tmp_path / "b.tar.gz")
    assert result.exit_code == 2 and "Hugging Face token" in result.output, result.output
    _assert_escaped(result.output)
    missing = _cli("eval", "--api-base", "http://127.0.0.1:9", "--data", tmp_path / f"gone{ESC_TITLE}.jsonl")
    assert missing.exit_code == 2, missing.output
    _assert_escaped(missing.output)


def test_case_5_an_escape_sequence_in_a_reply_is_printed_escaped(tmp_path):
    data = _eval_rows(tmp_path / "d.jsonl")
    body = f"{ESC_TITLE}overloaded".encode()
    with FakeSGLang(chat=lambda q: ChatReply(status=503, raw=body)) as server:
        result = _cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json")
    assert result.exit_code == 1 and "overloaded" in result.output, result.output
    _assert_escaped(result.output)


def test_case_5_an_escape_sequence_in_a_served_model_id_is_printed_escaped(tmp_path):
    data = _eval_rows(tmp_path / "d.jsonl")
    with FakeSGLang(model_id=f"sala{ESC_TITLE}", chat=lambda q: ChatReply("</think>ANSWER: B")) as server:
        assert _cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json").exit_code == 0
    for fmt in ("table", "md", "csv"):
        result = _cli("compare", tmp_path / "e.json", "--format", fmt)
        assert result.exit_code == 0 and "sala" in result.output, result.output
        _assert_escaped(result.output)
