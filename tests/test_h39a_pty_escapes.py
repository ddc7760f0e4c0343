"""Issue 39, terminal escapes: every listing command, run on a pseudo-terminal (rich styles its output there, and
nowhere else), over hostile names and contents, sends the terminal none of the data's control bytes.

The payload holds a clear-screen (ESC [ 2 J), an OSC 8 hyperlink and an OSC 0 window title (ESC ] ... BEL / ST), a
BEL, a C1 CSI (U+009B) and a bidi override (U+202E). rich's own styling is allowed: an ESC may only start an SGR
sequence (ESC [ ... m) or the cursor codes rich's status line uses. Every payload must appear escaped instead.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from under_test import SOARPACK_ROOT

PAYLOAD = "\x1b[2J\x1b]8;;http://evil.example/\x1b\\LINK\x1b]8;;\x1b\\\x1b]0;pwned\x07\x07\x9b31m\u202eRLO"
NAME = "evil" + PAYLOAD.replace("/", "_")  # as a file name (no slash)
# What rich may send itself: SGR styling, and its status line's cursor hide/show, erase-line and cursor-up.
ALLOWED_ESC = re.compile(rb"\x1b\[[0-9;]*m|\x1b\[\?25[lh]|\x1b\[[0-9]*[AK]|\x1b\[2K")
RAW = (b"\x07", "\x9b".encode(), "\u202e".encode(), b"\x9b")
TIMEOUT_S = 300


def run_on_pty(args, cwd, env_extra=None, timeout=TIMEOUT_S, answer: bytes = b"n\n") -> bytes:
    """`python -m soarpack ARGS` with stdin, stdout and stderr on one pseudo-terminal; everything it wrote."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONPATH=os.pathsep.join([SOARPACK_ROOT, env.get("PYTHONPATH", "")]),
               **(env_extra or {}))
    proc = subprocess.Popen([sys.executable, "-m", "soarpack", *map(str, args)], stdin=slave, stdout=slave,
                            stderr=slave, cwd=cwd, env=env, close_fds=True, start_new_session=True)
    os.close(slave)
    os.write(master, answer)  # what a prompt (cache clear's "delete these?") reads: no
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"soarpack {args} did not end in {timeout} s: {bytes(out[-2000:])!r}")
    finally:
        os.close(master)
        proc.wait(timeout=60)
    return bytes(out)


def data_escapes(out: bytes) -> list:
    """The control bytes in `out` that are not rich's own styling."""
    rest = ALLOWED_ESC.sub(b"", out)
    found = [m.group()[:12] for m in re.finditer(rb"\x1b.{0,11}", rest, re.S)]
    found += [raw for raw in RAW if raw in rest]
    return found


def assert_clean(out: bytes, must_show: str = "") -> None:
    bad = data_escapes(out)
    assert not bad, (bad, out[-3000:])
    plain = ALLOWED_ESC.sub(b"", out).decode("utf-8", "replace")
    if must_show:  # the hostile text was printed, escaped: what was shown is what the data holds
        assert must_show in plain, plain[-3000:]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Hostile names and contents for every listing command."""
    from soarpack.bundle.build import build_bundle
    from soarpack.bundle.tarpack import safe_extract, write_tarball

    try:
        from soarpack.cachemark import mark
    except ImportError:  # a soarpack before cache markers: the entry is listed all the same
        def mark(folder, entry):
            pass

    w = tmp_path_factory.mktemp("hostile")
    f = {"w": w}
    # cache: entry names that are escapes, a marked one and an unmarked one
    cache = w / "cache"
    (cache / NAME).mkdir(parents=True)
    (cache / "image-stack" / NAME).mkdir(parents=True)
    mark(cache / "image-stack" / NAME, f"image-stack/{NAME}")
    f["cache"] = cache
    # logs for diagnose: a hostile file name, a known failure's line and an unknown error line with the payload
    logs = w / "logs"
    logs.mkdir()
    (logs / f"{NAME}.log").write_text(
        f"starting {PAYLOAD}\n"
        f"ValueError: Virtual pool 'model_loader:cpu{PAYLOAD}' requests 2 workers but parent 'cpu' only has 1\n")
    (logs / "other.log").write_text(f"Traceback (most recent call last):\n  File \"x{PAYLOAD}.py\", line 1\n"
                                    f"RuntimeError: boom {PAYLOAD}\n")
    rows = [{"index": i, "task": f"qa{PAYLOAD}", "prediction": "", "output_tokens": 3, "error": f"HTTP 500: {PAYLOAD}",
             "score": 0.0} for i in range(2)]
    (logs / "eval.json").write_text(json.dumps({"kind": "soarpack.eval", "rows": rows, "max_tokens": 16}))
    f["logs"] = logs
    # a bundle with a hostile calibration file name, and one whose prepare_env.sh and bundle.env are tampered with
    calib = w / f"{NAME}.jsonl"
    calib.write_text(json.dumps({"text": f"prose {PAYLOAD} " * 20}) + "\n")
    bundle = build_bundle(w / "b.tar.gz", wheels=False, calib=[calib], calib_rows=8).path
    f["bundle"] = bundle
    tree = safe_extract(bundle, w / "tree")
    with open(tree / "prepare_env.sh", "a") as fh:
        fh.write(f"\n# a comment {PAYLOAD}\nexport EVIL=\"{PAYLOAD}\"\nexport EVIL2='{PAYLOAD}'\n")
    env_text = (tree / "bundle.env").read_text()
    (tree / "bundle.env").write_text(env_text.replace("SOARPACK_BUNDLE_PROFILE=", f"SOARPACK_BUNDLE_PROFILE='{PAYLOAD}'\n#"))
    f["steps_bundle"] = write_tarball(tree, w / "steps.tar.gz")
    # results for compare: an eval run with a label, a served model name and task names that are escapes
    from soarpack.measure.evaluate import EvalConfig, run_eval
    from soarpack.serve.fake_server import ChatReply, FakeSGLang, GenerateScript

    data = w / "data.jsonl"
    data.write_text("".join(json.dumps({"task": f"t{PAYLOAD}", "question": f"q{i}", "gold": ["x"]}) + "\n"
                            for i in range(3)))
    server = FakeSGLang(f"m{PAYLOAD}", chat=lambda q: ChatReply(f"</think>x {PAYLOAD}"),
                        generate=GenerateScript()).start()
    try:
        run_eval(EvalConfig(api_base=server.url, data=data, output=w / "eval-h.json", label=f"run{PAYLOAD}"))
    finally:
        server.stop()
    f["eval"] = w / "eval-h.json"
    # calib preview: a hostile file name and rows
    (w / f"c{NAME}.jsonl").write_text("".join(json.dumps({"text": f"row {PAYLOAD} " * 10}) + "\n" for _ in range(3)))
    f["calib_file"] = w / f"c{NAME}.jsonl"
    # a recipe file named and filled with escapes; an sglang tree with hostile names
    toml_escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f or c == "\u202e" else c
                           for c in PAYLOAD.replace("\\", "_"))
    (w / f"r{NAME}.toml").write_text(f'[quant]\ndescription = "d{toml_escaped}"\n')
    f["recipe"] = w / f"r{NAME}.toml"
    fork = w / f"fork{NAME}"
    (fork / "sglang" / "srt" / NAME).mkdir(parents=True)
    (fork / "sglang" / "__init__.py").write_text("")
    f["fork"] = fork
    return f


def _tok(tmp_path_factory):
    from tiny_tokenizer import make_tiny_tokenizer

    return make_tiny_tokenizer(tmp_path_factory.mktemp("tok") / "model", text=" ".join(["word"] * 40))


def _cases(f, tok=None):
    return {
        "cache list": (["cache", "list"], {"SOARPACK_CACHE": str(f["cache"])}, "\\x1b[2J"),
        "cache clear (dry run)": (["cache", "clear"], {"SOARPACK_CACHE": str(f["cache"])}, "\\x1b[2J"),
        "env": (["env"], {"SOARPACK_CACHE": str(f["cache"]), "SOARPACK_PYTHON310": f"/nope/{NAME}"}, "\\x1b[2J"),
        "diagnose": (["diagnose", f["logs"]], {}, "\\x1b[2J"),
        "diagnose one file": (["diagnose", f["logs"] / f"{NAME}.log"], {}, "\\x1b[2J"),
        "inspect": (["inspect", f["bundle"]], {}, "\\x1b[2J"),
        "inspect --steps": (["inspect", "--steps", f["steps_bundle"]], {}, "\\x1b[2J"),
        "recipes": (["recipes"], {}, ""),
        "recipes FILE": (["recipes", f["recipe"]], {}, "\\x1b[2J"),
        "profiles": (["profiles"], {}, ""),
        "compare": (["compare", f["eval"]], {}, "\\x1b[2J"),
        "calib": (["calib", f["calib_file"], "--model-dir", tok, "--max-len", "64", "-n", "3"], {}, "\\x1b[2J"),
        "sglang check": (["sglang", "check", "--sglang-src", f["fork"]], {}, "\\x1b[2J"),
    }


CASE_NAMES = list(_cases({k: Path("x") for k in ("cache", "logs", "bundle", "steps_bundle", "eval", "calib_file",
                                                  "recipe", "fork")}))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_no_raw_escape_reaches_the_terminal(case, hostile, tmp_path_factory, tmp_path):
    tok = _tok(tmp_path_factory) if case == "calib" else None
    args, env, must_show = _cases(hostile, tok)[case]
    out = run_on_pty(args, cwd=tmp_path, env_extra=env)
    assert_clean(out, must_show)


def test_the_check_itself_catches_a_raw_payload():
    """The detector is not blind: rich's styling passes, the payload does not."""
    assert data_escapes(b"\x1b[1;31mFAIL\x1b[0m plain") == []
    assert data_escapes(PAYLOAD.encode())
    assert data_escapes("a\u202eb".encode()) and data_escapes(b"ding\x07")
