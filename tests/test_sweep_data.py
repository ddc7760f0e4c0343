"""Reliability sweep 2026-11-30 (issue 14), the data rows: one test per row of
../shared/docs/reliability-sweep-2026-11-30.md, named test_row_NNN_*, so the table can be re-counted here.

Bad input: exit 2, no traceback, a message naming the input. Data loss: the earlier file is kept. Silent-wrong
rows say whether they are now an error or a warning. Servers listen on 127.0.0.1 only; every loop is bounded.
"""

from __future__ import annotations

import errno
import io
import json
import time
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import MAX_HOLD_S, ChatReply, FakeSGLang, GenerateScript
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.measure.speed import BenchConfig, partial_path, run_bench
from soarpack.bundle import secrets
from soarpack.bundle.build import build_bundle
from soarpack.bundle.secrets import CredentialError, find_secret, find_secret_in_stream, scan_tree
from soarpack.bundle.wheels import make_pure_wheel
from soarpack.cli import app
from soarpack.errors import InputDataError
from soarpack.placement.content import sha256_file
from soarpack.quant.calib import read_examples
from soarpack.serve.lint import lint_args

QUIET = dict(calib_rows=8)
HF_TOKEN = "hf_" + "Ab3" * 12


def flat(result) -> str:
    """CLI output without the 80-column console's line wrapping."""
    return "".join(result.output.split())


def assert_bad_input(result, *names: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for name in names:
        assert "".join(str(name).split()) in flat(result), (name, result.output)


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def eval_rows(n: int):
    return [{"task": "mcq", "question": f"question {i}", "gold": "B"} for i in range(n)]


def run_cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "model")


@pytest.fixture
def read_only(monkeypatch):
    """A read-only mount, as the probe of ensure_writable_output meets it (tests run as root: chmod cannot)."""
    import soarpack.placement.checks as checks

    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(checks.tempfile, "mkstemp", refuse)


# -- 24: rich markup ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, shown", [
    ("[quant]\nbits = 4\ngroup_size = 128\nsym = true\ndesc_act = false\ncolour = 1\n", "unknown key [quant].colour"),
    ("", "has no [quant] table"),
], ids=["unknown-key", "empty-file"])
def test_row_024_error_text_keeps_its_brackets(tmp_path, content, shown):
    recipe = tmp_path / "r.toml"
    recipe.write_text(content)
    result = run_cli("build", "--recipe", recipe, "--no-wheels", "-o", tmp_path / "b.tar.gz")
    assert_bad_input(result, shown)


# -- 42-47: calibration data -------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".txt"])
def test_row_042_043_non_utf8_calibration_names_file_and_place(tmp_path, suffix):
    bad = tmp_path / f"c{suffix}"
    bad.write_bytes(b'{"text": "fine row"}\n' + bytes(range(128, 256)) * 4 + b"\n")
    with pytest.raises(InputDataError, match="not UTF-8") as exc:
        read_examples(bad)
    assert (f"c{suffix}:2" if suffix == ".jsonl" else f"c{suffix}") in exc.value.message


def test_row_042_non_utf8_jsonl_in_build_is_one_line_error(tmp_path):
    bad = tmp_path / "rand.jsonl"
    bad.write_bytes(b'{"text": "ok"}\n\xff\xfe\x00garbage\n')
    result = run_cli("build", "--calib", bad, "--no-wheels", "-o", tmp_path / "b.tar.gz")
    assert_bad_input(result, "rand.jsonl:2", "not UTF-8")
    assert not (tmp_path / "b.tar.gz").exists()


def test_row_043_binary_looking_text_is_refused_now_an_error(tmp_path):
    utf16 = tmp_path / "notes.txt"
    utf16.write_bytes("calibration prose, saved as UTF-16 by mistake".encode("utf-16-le"))  # valid UTF-8, full of NULs
    with pytest.raises(InputDataError, match="control or replacement characters") as exc:
        read_examples(utf16)
    assert "notes.txt" in exc.value.message
    prose = tmp_path / "prose.txt"
    prose.write_text("Ordinary prose.\tWith a tab,\nnew lines\r\nand a form feed\f is text.\n")
    assert read_examples(prose)[0].text.startswith("Ordinary")


@pytest.mark.parametrize("content", [42, ["a list"], None], ids=["int", "list", "null"])
def test_row_045_messages_content_not_a_string_names_file_and_line(tmp_path, content):
    path = write_jsonl(tmp_path / "m.jsonl", [{"text": "ok"}, {"messages": [{"role": "user", "content": content}]}])
    with pytest.raises(InputDataError, match="content` must be a non-empty string") as exc:
        read_examples(path)
    assert "m.jsonl:2" in exc.value.message


def test_row_046_build_refuses_calibration_that_would_crash_quantize_now_an_error(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "fine"}]},
                                                 {"messages": [{"role": "user", "content": 42}]}])
    result = run_cli("build", "--calib", path, "--no-wheels", "-o", tmp_path / "b.tar.gz")
    assert_bad_input(result, "chat.jsonl:2")
    assert not (tmp_path / "b.tar.gz").exists()


def test_row_046_every_chat_row_is_rendered_through_the_template(tmp_path, monkeypatch):
    from soarpack.sala import chat

    # A template that fails on one row only: the check renders each row, not a sample.
    monkeypatch.setattr(chat, "CHAT_TEMPLATE", "{% for m in messages %}{% if m['content'] == 'boom' %}"
                                               "{{ undefined_helper() }}{% endif %}{{ m['content'] }}{% endfor %}")
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "fine"}]},
                                                 {"messages": [{"role": "user", "content": "boom"}]}])
    with pytest.raises(InputDataError, match="chat template cannot render") as exc:
        read_examples(path)
    assert "chat.jsonl:2" in exc.value.message


def test_row_047_lone_surrogate_names_file_and_line(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "broken \\ud800 here"}\n')
    with pytest.raises(InputDataError, match="lone surrogate") as exc:
        read_examples(path)
    assert "s.jsonl:2" in exc.value.message


# -- 52-58, 81: secrets ------------------------------------------------------------------------------------------


def test_row_052_secret_in_a_bin_calibration_file_is_refused(tmp_path):
    calib = tmp_path / "data.bin"
    calib.write_text(f"calibration prose with a key {HF_TOKEN} inside\n")
    with pytest.raises(CredentialError, match="Hugging Face token") as exc:
        build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[calib], **QUIET)
    assert "calib/00-data.bin" in exc.value.message
    assert not (tmp_path / "b.tar.gz").exists()


def test_row_053_secret_after_8_mib_is_found(tmp_path):
    calib = tmp_path / "late.jsonl"
    filler = json.dumps({"text": "plain words " * 80}) + "\n"
    with calib.open("w") as fh:
        fh.write(filler * (int(8.6e6) // len(filler)))
        fh.write(json.dumps({"text": "ghp_" + "B" * 36}) + "\n")
    assert calib.stat().st_size > 8 * 1024 * 1024
    with pytest.raises(CredentialError, match="GitHub token") as exc:
        build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[calib], **QUIET)
    assert "calib/00-late.jsonl" in exc.value.message


def test_row_053_a_secret_cut_by_a_block_edge_is_found():
    token = b"glpat-" + b"x1Y2" * 6
    for cut in range(1, len(token)):
        data = b" " * (secrets.BLOCK_BYTES - cut) + token + b" tail"
        assert find_secret_in_stream(io.BytesIO(data)) == "a GitLab token", cut
    assert find_secret_in_stream(io.BytesIO(b"a" * (3 * secrets.BLOCK_BYTES))) is None


def test_row_054_pgp_private_key_block_in_calibration_is_refused(tmp_path):
    calib = tmp_path / "keys.txt"
    calib.write_text("notes\n-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQdGBGV...\n")
    with pytest.raises(CredentialError, match="private key") as exc:
        build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[calib], **QUIET)
    assert "calib/00-keys.txt" in exc.value.message


@pytest.mark.parametrize("name", [".env", "id_rsa"])
def test_row_055_credential_names_are_refused_under_the_original_name(tmp_path, name):
    calib = tmp_path / "sec" / name
    calib.parent.mkdir()
    calib.write_text("just words, no pattern\n")
    with pytest.raises(CredentialError) as exc:
        build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[calib], **QUIET)
    assert f"sec/{name}" in exc.value.message
    packed = tmp_path / "tree" / "calib" / f"00-{name}"  # and under the packed name, as check sees it
    packed.parent.mkdir(parents=True)
    packed.write_text("just words\n")
    with pytest.raises(CredentialError, match=f"calib/00-{name}"):
        scan_tree(tmp_path / "tree")


RULES = [
    ("private key", b"-----BEGIN PGP PRIVATE KEY BLOCK-----\n", b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n"),
    ("private key", b"-----BEGIN OPENSSH PRIVATE KEY-----\n", b"the words BEGIN and PRIVATE KEY in prose\n"),
    ("AWS secret access key", b"aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
     b"commit 2b33edc1f0e4c0b6a9d1e2f3a4b5c6d7e8f90a1b and aws_secret_access_key = <yours>\n"),
    ("AWS secret access key", b'"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"',
     b"AWS_SECRET_ACCESS_KEY is read from the environment\n"),
    ("GitLab token", b"token glpat-Xy12_ab34-CD56ef78GH90\n", b"GitLab tokens start with glpat- and 20 characters\n"),
    ("Google API key", b"key=AIzaSyD-1234567890abcdefghijklmnopqrstu\n", b"AIzawl is written Aizawl; AIza alone is no key\n"),
    ("Hugging Face token", b"HF_TOKEN=hf_Ab3Cd4Ef5Gh6\n", b"hf_quantizer_config = hf_Config; hf_tokenizer2 and hf_abcdefghijk\n"),
    ("Hugging Face token", b"hf_" + b"a" * 34, b"hf_" + b"a" * 8),
]


@pytest.mark.parametrize("what, positive, negative", RULES, ids=[f"{r[0]}-{i}" for i, r in enumerate(RULES)])
def test_row_056_each_rule_has_a_positive_and_a_negative_case(what, positive, negative):
    assert what in (find_secret(positive) or "")
    assert find_secret(negative) is None


def test_row_056_new_rules_refuse_calibration_at_build(tmp_path):
    calib = tmp_path / "c.jsonl"
    write_jsonl(calib, [{"text": "the key is AIzaSyD-1234567890abcdefghijklmnopqrstu for maps"}])
    with pytest.raises(CredentialError, match="Google API key"):
        build_bundle(tmp_path / "b.tar.gz", wheels=False, calib=[calib], **QUIET)


@pytest.mark.parametrize("member, body, what", [
    ("evil/config.py", f"TOKEN = '{HF_TOKEN}'\n", "Hugging Face token"),
    ("evil/.env", "HF_HOME=/tmp\n", "'.env'"),
], ids=["token-in-member", "env-member"])
def test_row_058_wheel_dir_wheels_are_opened_and_scanned(tmp_path, member, body, what):
    wheels = tmp_path / "wh"
    make_pure_wheel(wheels, "evil", "1.0", {"evil/__init__.py": "", member: body})
    with pytest.raises(CredentialError, match=what) as exc:
        build_bundle(tmp_path / "b.tar.gz", wheels=True, wheel_dir=wheels, **QUIET)
    assert f"wheels/evil-1.0-py3-none-any.whl!{member}" in exc.value.message
    assert not (tmp_path / "b.tar.gz").exists()


def test_row_058_locked_wheels_are_checked_by_sha256_not_opened(tmp_path, monkeypatch):
    tree = tmp_path / "tree" / "wheels"
    wheel = make_pure_wheel(tree, "fixture-pkg", "1.0", {"fixture_pkg/tests/data.txt": f"sample {HF_TOKEN}\n"})
    with pytest.raises(CredentialError, match="fixture_pkg/tests/data.txt"):
        scan_tree(tree.parent)
    pinned = frozenset({sha256_file(wheel)})
    monkeypatch.setattr(secrets, "locked_wheel_digests", lambda: pinned)
    scan_tree(tree.parent)  # the published artifact pinned in the lock: its fixtures are not ours
    wheel.write_bytes(wheel.read_bytes() + b"\0")  # the same name, other bytes: opened again
    with pytest.raises(CredentialError):
        scan_tree(tree.parent)


@pytest.mark.parametrize("rel, content, what", [
    ("calib/notes.bin", f"\x00\x01binary {HF_TOKEN}\x02".encode(), "Hugging Face token"),
    ("calib/key.asc", b"-----BEGIN PGP PRIVATE KEY BLOCK-----\nlQdG\n", "private key"),
    (".cache/huggingface/token", b"abcdef0123456789\n", "login token file"),
], ids=["bin-token", "pgp-asc", "hf-token-file"])
def test_row_081_check_credentials_step_finds_them(tmp_path, rel, content, what):
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_bytes(content)
    with pytest.raises(CredentialError, match=what) as exc:
        scan_tree(tmp_path)
    assert rel in exc.value.message


# -- 95-111: eval ------------------------------------------------------------------------------------------------


def test_row_095_eval_server_500_is_incomplete_and_exits_1(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(4))
    out = tmp_path / "e.json"
    with FakeSGLang(chat=lambda q: ChatReply(status=500)) as server:
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", out)
        assert len(server.chat_bodies) == 4  # no retry unless asked, as eval_model.py
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "evalincomplete:4of4requestsfailed" in flat(result)
    saved = json.loads(out.read_text())
    assert saved["complete"] is False and saved["failed"] == 4


def test_row_095_retries_are_opt_in_and_reported_with_and_without(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(4))
    seen = {}

    def flaky(question):
        seen[question] = seen.get(question, 0) + 1
        return ChatReply(status=500) if seen[question] == 1 and question.endswith(("0", "1")) else ChatReply("ANSWER: B")

    with FakeSGLang(chat=flaky) as server:
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json", "--retries", "2")
    assert result.exit_code == 0, result.output
    saved = json.loads((tmp_path / "e.json").read_text())
    assert saved["complete"] and saved["ori_accuracy"] == 100.0 and saved["retried"] == 2
    assert saved["without_retries"]["ori_accuracy"] == 50.0
    assert "withoutretries" in flat(result)


@pytest.mark.parametrize("raw", [b'{"choices": [', b"<html><body>502 Bad Gateway</body></html>", b'{"choices": []}'],
                         ids=["malformed-json", "html", "empty-choices"])
def test_row_096_eval_malformed_replies_are_incomplete(tmp_path, raw):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(3))
    with FakeSGLang(chat=lambda q: ChatReply(raw=raw)) as server:
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json")
    assert result.exit_code == 1 and "Traceback" not in result.output
    saved = json.loads((tmp_path / "e.json").read_text())
    assert saved["complete"] is False and saved["failed"] == 3
    assert all("malformed reply" in e["error"] for e in saved["errors"])


def test_row_097_eval_body_shorter_than_content_length_stalls_out(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(2))
    start = time.monotonic()
    with FakeSGLang(chat=lambda q: ChatReply(missing_bytes=50)) as server:
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json",
                         "--stall-timeout", "0.5")
    assert time.monotonic() - start < MAX_HOLD_S  # the server holds it that long: cut by the stall timeout
    assert result.exit_code == 1
    saved = json.loads((tmp_path / "e.json").read_text())
    assert saved["failed"] == 2 and all("stalled" in e["error"] for e in saved["errors"])
    helptext = "".join(run_cli("eval", "--help").output.split())
    assert "--stall-timeout" in helptext and "default:60.0" in helptext


@pytest.mark.parametrize("content", [42, ["a", "list"]], ids=["int", "list"])
def test_row_099_non_string_content_does_not_crash_or_lose_rows(tmp_path, content):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(3))
    with FakeSGLang(chat=lambda q: ChatReply(content=content) if q.endswith("1") else ChatReply("ANSWER: B")) as server:
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json")
    assert result.exit_code == 1 and "Traceback" not in result.output
    saved = json.loads((tmp_path / "e.json").read_text())
    assert [r["index"] for r in saved["rows"]] == [0, 1, 2]
    assert saved["rows"][1]["score"] == 0 and "not a string" in saved["rows"][1]["error"]
    assert saved["rows"][0]["score"] == 1 and saved["rows"][2]["score"] == 1


def test_row_105_num_samples_into_a_fuller_output_keeps_every_row(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(20))
    out = tmp_path / "e.json"
    with FakeSGLang(chat=lambda q: ChatReply("ANSWER: B")) as server:
        assert run_cli("eval", "--api-base", server.url, "--data", data, "-o", out).exit_code == 0
        before = json.loads(out.read_text())["rows"]
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", out, "--num-samples", "5")
        assert result.exit_code == 0, result.output
        assert len(server.chat_bodies) == 20  # the 5 were already scored
        saved = json.loads(out.read_text())
        assert saved["rows"] == before and saved["total"] == 5 and saved["scored"] == 5
        assert run_cli("eval", "--api-base", server.url, "--data", data, "-o", out).exit_code == 0
        assert len(server.chat_bodies) == 20  # the full run sends nothing again


@pytest.mark.parametrize("existing", [b"[1, 2, 3]", bytes(range(256))], ids=["json-list", "binary"])
def test_row_106_eval_output_that_is_not_an_eval_result_is_refused_before_any_request(tmp_path, existing):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(2))
    out = tmp_path / "e.json"
    out.write_bytes(existing)
    with FakeSGLang() as server:
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", out)
        assert server.chat_bodies == []
    assert_bad_input(result, out.name)
    assert out.read_bytes() == existing


def test_row_108_eval_output_a_directory_or_read_only_is_refused_before_any_request(tmp_path, monkeypatch):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(2))
    with FakeSGLang() as server:
        (tmp_path / "adir").mkdir()  # (tmp_path itself holds the data: that is refused as containing an input)
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "adir")
        assert_bad_input(result, "is a directory")
        import soarpack.placement.checks as checks

        monkeypatch.setattr(checks.tempfile, "mkstemp", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system")))
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json")
        assert_bad_input(result, "e.json", "Read-only")
        assert server.chat_bodies == []


@pytest.mark.parametrize("flag, value", [("--timeout", "0"), ("--timeout", "-1"), ("--stall-timeout", "0"),
                                         ("--max-tokens", "-5"), ("--retries", "-1")])
def test_row_110_111_eval_nonsense_limits_are_refused(tmp_path, flag, value):
    data = write_jsonl(tmp_path / "d.jsonl", eval_rows(2))
    with FakeSGLang() as server:
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", tmp_path / "e.json", flag, value)
        assert server.chat_bodies == []
    assert_bad_input(result, f"{flag} {value}")


# -- 114-123: bench, score, speedset -----------------------------------------------------------------------------


def speed_file(path: Path, n: int, out_len: int = 6) -> Path:
    return write_jsonl(path, [{"question": f"row {i} the river town", "model_response": " ".join(["tok"] * out_len)}
                              for i in range(n)])


def test_row_114_short_outputs_are_marked_and_score_refuses_them_now_an_error(tmp_path, tokenizer_dir):
    data = speed_file(tmp_path / "s.jsonl", 3)
    out = tmp_path / "b.json"
    with FakeSGLang(generate=GenerateScript(stop_after=1)) as server:
        result = run_cli("bench", "--api-base", server.url, "--s1", data, "--s8", data, "--smax", data,
                         "--tokenizer", tokenizer_dir, "-o", out, "--settle", "0", "--no-warmup")
    assert result.exit_code == 1 and "short" in result.output
    tiers = json.loads(out.read_text())["tiers"]
    assert tiers["s1"]["short_outputs"] == 3 and tiers["s1"]["failed"] == 0
    assert tiers["s1"]["short_examples"][0] == "1 of 6 tokens"
    result = run_cli("score", "--ours", out, "--best", out)
    assert_bad_input(result, "fewer tokens than asked", out.name)


def test_row_115_bench_stream_that_stops_without_closing_stalls_out(tmp_path, tokenizer_dir):
    data = speed_file(tmp_path / "s.jsonl", 2)
    start = time.monotonic()
    with FakeSGLang(generate=GenerateScript(stall_after=2)) as server:
        report = run_bench(BenchConfig(api_base=server.url, tiers={"s1": data}, model_dir=Path(tokenizer_dir),
                                       settle_s=0.0, warmup=False, stall_s=0.5))
    assert time.monotonic() - start < MAX_HOLD_S  # the server holds it that long: cut by the stall timeout
    assert report["tiers"]["s1"]["failed"] == 2 and all("stalled" in e for e in report["tiers"]["s1"]["errors"])
    helptext = "".join(run_cli("bench", "--help").output.split())
    assert "--stall-timeout" in helptext and "default:600.0" in helptext


def test_row_116_interrupted_bench_keeps_the_earlier_complete_output(tmp_path, tokenizer_dir):
    data = speed_file(tmp_path / "s.jsonl", 3)
    out = tmp_path / "bench.json"
    with FakeSGLang(generate=GenerateScript(token_delay_s=0.001)) as server:
        tiers = {"s1": data, "s8": data, "smax": data}
        run_bench(BenchConfig(api_base=server.url, tiers=tiers, model_dir=Path(tokenizer_dir), output=out, settle_s=0.0))
        earlier = out.read_bytes()

        def interrupt_in_s8(event):
            if event.phase == "s8":
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            run_bench(BenchConfig(api_base=server.url, tiers=tiers, model_dir=Path(tokenizer_dir), output=out,
                                  settle_s=0.0), interrupt_in_s8)
    assert out.read_bytes() == earlier
    assert set(json.loads(partial_path(out).read_text())["tiers"]) == {"s1"}


def bench_json(path: Path, **durations) -> Path:
    path.write_text(json.dumps({"kind": "soarpack.bench", "tiers": {
        t: {"duration_s": durations.get(t, 10.0), "failed": 0} for t in ("s1", "s8", "smax")}}))
    return path


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_row_119_score_refuses_non_finite_bests(tmp_path, value):
    ours = bench_json(tmp_path / "b.json")
    result = run_cli("score", "--ours", ours, "--best", ours, "--best-s1", value)
    assert_bad_input(result, "best duration for s1 is not a positive finite number")


@pytest.mark.parametrize("content", [b"[1, 2]", bytes(range(256)), b'{"kind": "soarpack.bench", "tiers": [1]}'],
                         ids=["json-list", "binary", "tiers-list"])
def test_row_120_score_ours_not_a_bench_result_is_one_line_error(tmp_path, content):
    ours = tmp_path / "ours.json"
    ours.write_bytes(content)
    result = run_cli("score", "--ours", ours, "--best-s1", "1", "--best-s8", "1", "--best-smax", "1")
    assert_bad_input(result, ours.name)


def test_row_122_speedset_empty_text_is_refused_not_replaced(tmp_path, tokenizer_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    result = run_cli("speedset", "--tokenizer", tokenizer_dir, "-n", "2", "-o", tmp_path / "s.jsonl", "--text", empty)
    assert_bad_input(result, "empty.txt", "is empty")
    assert not (tmp_path / "s.jsonl").exists()


def test_row_123_speedset_output_a_directory_or_read_only_is_one_line_error(tmp_path, tokenizer_dir, read_only):
    result = run_cli("speedset", "--tokenizer", tokenizer_dir, "-n", "2", "-o", tmp_path, "--force")
    assert_bad_input(result, "is a directory")
    result = run_cli("speedset", "--tokenizer", tokenizer_dir, "-n", "2", "-o", tmp_path / "s.jsonl")
    assert_bad_input(result, "s.jsonl", "Read-only")


# -- 131: lint ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, flagged", [("7", True), ("0", True), ("1", True), ("-0.5", True), ("nan", True),
                                            ("lots", True), ("0.85", False), ("0.5", False)])
def test_row_131_mem_fraction_static_must_be_in_the_open_unit_interval(value, flagged):
    findings = [f for f in lint_args(["--mem-fraction-static", value]) if f.rule == "mem-fraction-range"]
    assert bool(findings) == flagged
    assert all(f.level == "error" for f in findings)
