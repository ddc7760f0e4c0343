"""The input sweep of docs/input-sweep.md: every command against bad (and some valid but unusual) input on each of
its input surfaces, each case run as `python -m soarpack ...` in a child process (60 s, 3 GiB of address space).

    PYTHONPATH=$PWD .venv/bin/python scripts/input_sweep.py            # this tree
    PYTHONPATH=/work/old .venv/bin/python scripts/input_sweep.py       # the soarpack of another checkout

The fixtures (tokenizer, tiny and quantized models, bundles, scripted servers) are made once with this checkout's
soarpack; the children import the soarpack of PYTHONPATH. A case passes when its exit code is the expected one, its output holds
the expected words and no traceback; the table printed is Markdown (id, command, surface, case, result).
Run from outside the checkout (cwd first on sys.path would shadow PYTHONPATH); it changes to a temp dir itself.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(HERE), str(HERE / "tests")]  # fixtures come from this checkout, the children from PYTHONPATH

TIMEOUT_S = 60


class _Html(BaseHTTPRequestHandler):
    """A server that answers everything with an HTML page (a proxy's error page, a wrong port)."""

    def log_message(self, *args):
        pass

    def _page(self):
        body = b"<html><body>502 Bad Gateway</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _page


def fixtures(work: Path) -> dict:
    from soarpack.serve.fake_server import ChatReply, FakeSGLang, GenerateScript
    from tiny_tokenizer import make_tiny_tokenizer
    from soarpack.bundle.build import build_bundle
    from soarpack.bundle.tarpack import safe_extract, write_tarball
    from soarpack.sala.tiny import make_tiny_model

    long = " ".join(["word"] * 40)
    f = {"w": str(work)}
    f["tok"] = make_tiny_tokenizer(work / "tok", text=long)
    tiny = make_tiny_model(work / "tiny", seed=0)
    f["tiny"] = str(tiny)
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize

    quantized = work / "quantized"  # a real GPTQ checkpoint of the tiny model (about 20 s on a CPU)
    quantize(tiny, quantized, quantize_options(rows=8, max_len=64))
    f["quantized"] = str(quantized)
    bundle = build_bundle(work / "b.tar.gz", wheels=False, calib_rows=8).path
    f["bundle"] = str(bundle)

    def write(name, text, mode="w"):
        path = work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if mode == "wb":
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
        f[name.replace(".", "_").replace("/", "_").replace("-", "_")] = str(path)
        return path

    rows = "".join(json.dumps({"text": f"row {i} {long}"}) + "\n" for i in range(3))
    write("cal.NDJSON", rows)
    write("cal.jsonl", rows)
    write("cal_ls.jsonl", json.dumps({"text": f"{long}\u2028{long}\u0085{long}"}, ensure_ascii=False) + "\n")
    write("cal_ws.jsonl", json.dumps({"text": "   "}) + "\n")
    write("q.jsonl", json.dumps({"task": "mcq", "question": f"pick {long}", "gold": "A"}) + "\n")
    write("bad.toml", b"[quant]\nname = \"\xff\xfe\"\n", "wb")
    write("data.jsonl", "".join(json.dumps({"task": "niah", "question": f"q{i}", "gold": ["x"]}) + "\n" for i in range(3)))
    write("data_ls.jsonl", json.dumps({"task": "niah", "question": "a\u2028b", "gold": ["x"]}, ensure_ascii=False) + "\n")
    write("data_ws.jsonl", json.dumps({"task": "niah", "question": " \t ", "gold": ["x"]}) + "\n")
    write("list.json", "[1, 2]")
    write("speed.jsonl", "".join(json.dumps({"question": f"q {long}", "model_response": long}) + "\n" for _ in range(4)))
    write("speed_ls.jsonl", json.dumps({"question": f"q\u2028{long}", "model_response": long}, ensure_ascii=False) + "\n")
    write("afile", "a file\n")
    (work / "adir").mkdir()
    f["adir"] = str(work / "adir")

    # a chat template that raises, a tokenizer larger than config.json's vocab_size
    raising = work / "raising"
    shutil.copytree(f["tok"], raising)
    config = json.loads((raising / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ raise_exception('no conversation is allowed') }}"
    (raising / "tokenizer_config.json").write_text(json.dumps(config))
    f["raising"] = str(raising)
    big_vocab = work / "bigvocab"
    shutil.copytree(tiny, big_vocab)
    from transformers import AutoTokenizer

    vocab = json.loads((big_vocab / "config.json").read_text())["vocab_size"]
    tokenizer = AutoTokenizer.from_pretrained(str(big_vocab), trust_remote_code=False)
    tokenizer.add_tokens([f"<extra_{i}>" for i in range(vocab - len(tokenizer) + 5)])
    tokenizer.save_pretrained(str(big_vocab))
    f["bigvocab"] = str(big_vocab)
    qc_list = work / "qclist"
    shutil.copytree(quantized, qc_list)
    (qc_list / "quantize_config.json").write_text("[1, 2]")
    f["qclist"] = str(qc_list)

    # bundles: other containers named .tar.gz, a malformed MANIFEST, a calibration row with U+2028
    def repack(name, mode):
        out = work / name
        with tarfile.open(bundle, "r:gz") as src, tarfile.open(out, mode) as dst:
            for member in src.getmembers():
                dst.addfile(member, src.extractfile(member) if member.isreg() else None)
        f[name.replace(".", "_").replace("-", "_")] = str(out)

    repack("plain.tar.gz", "w")
    repack("xz.tar.gz", "w:xz")
    tree = work / "tree"
    safe_extract(bundle, tree)
    manifest = json.loads((tree / "MANIFEST.json").read_text())
    (tree / "MANIFEST.json").write_text(json.dumps({**manifest, "quantize": "w4"}))
    f["badmanifest"] = str(write_tarball(tree, work / "badmanifest.tar.gz"))
    (tree / "MANIFEST.json").write_text(json.dumps({**manifest, "profile": "safe"}))
    f["badprofile"] = str(write_tarball(tree, work / "badprofile.tar.gz"))
    build_bundle(work / "ls.tar.gz", wheels=False, calib=[f["cal_ls_jsonl"]])
    f["lsbundle"] = str(work / "ls.tar.gz")

    # eval outputs: a hand-edited score, a JSON list
    good = FakeSGLang(chat=lambda q: ChatReply("</think>x"), generate=GenerateScript()).start()
    f["api"] = good.url
    html = ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    threading.Thread(target=html.serve_forever, daemon=True).start()
    f["html"] = f"http://127.0.0.1:{html.server_address[1]}"
    from soarpack.measure.evaluate import EvalConfig, run_eval

    edited = work / "edited.json"
    run_eval(EvalConfig(api_base=good.url, data=Path(f["data_jsonl"]), output=edited))
    saved = json.loads(edited.read_text())
    saved["rows"][0]["score"] = 50
    edited.write_text(json.dumps(saved))
    f["edited"] = str(edited)
    archives = sorted((HERE.parent / "shared" / "data" / "sglang-fork").glob("*-python.tar.gz"))
    if archives:  # a real fork tree for the sglang cases (the checkout's ../shared)
        with tarfile.open(archives[0]) as tar:
            tar.extractall(work / "fork", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        f["fork"] = str(work / "fork" / "python")
    file_cache = write("cachefile", "not a folder\n")
    f["cachefile"] = str(file_cache)
    fixtures_39b(work, f, write, tree, manifest, good)
    return f


# A launch_server stand-in whose child ignores SIGTERM (the leader obeys it), and never gets healthy.
STUBBORN_LAUNCH_SERVER = r'''
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "while True: time.sleep(1)\n", os.environ["STUBBORN_PIDFILE"]])
while True:
    time.sleep(1)
'''


def fixtures_39b(work: Path, f: dict, write, tree: Path, manifest: dict, good) -> None:
    """Issue 39, part B: results with a subnormal duration, a NaN or non-numeric accuracy, deep JSON, an eval and a
    bench of different models under one label; MANIFESTs with format 1.0/true, NaN or negative calibration
    counts, extra_args against the record, deep JSON; a profile with --port; deep and huge-row recipes; a
    SIGTERM-ignoring server child; a tmpfs to fill (where `unshare -rm` works)."""
    import math
    from soarpack.measure.evaluate import EvalConfig, run_eval
    from soarpack.bundle.tarpack import write_tarball

    def bench(durations, **top):
        tiers = {t: {"failed": 0, "short_outputs": 0, "duration_s": d} for t, d in durations.items()}
        return json.dumps({"kind": "soarpack.bench", "version": 2, "tiers": tiers, **top})

    def evaluation(overall):
        return json.dumps({"kind": "soarpack.eval", "complete": True, "overall_accuracy": overall, "scored": 1,
                           "total": 1})

    ours = {"s1": 10.0, "s8": 20.0, "smax": 30.0}
    write("b39_ours.json", bench(ours))
    write("b39_sub.json", bench({**ours, "s1": 5e-324}))
    write("e39_nan.json", evaluation(math.nan))
    write("e39_str.json", evaluation("high"))
    deep = "[" * 100_000 + "]" * 100_000
    write("deep.json", deep)
    run_eval(EvalConfig(api_base=good.url, data=Path(f["data_jsonl"]), output=work / "e39_mine.json", label="mine"))
    f["e39_mine"] = str(work / "e39_mine.json")
    write("b39_other.json", bench(ours, model="sala-bf16", api_base="http://10.0.0.9:30000",
                                  measured={"label": "mine", "served_model": {"id": "sala-bf16", "root": "/m"}}))
    edits = {
        "m39_fmt10": lambda m: m.update(format=1.0),
        "m39_fmttrue": lambda m: m.update(format=True),
        "m39_calnan": lambda m: m["quantize"]["calibration"].update(rows_asked=math.nan),
        "m39_calneg": lambda m: m["quantize"]["calibration"]["sources"][0].update(rows=-1),
        "m39_extra8": lambda m: m["quantize"].update(extra_args=["--rows", "8"]),
    }
    for name, edit in edits.items():
        edited = json.loads(json.dumps(manifest))
        edit(edited)
        (tree / "MANIFEST.json").write_text(json.dumps(edited))
        f[name] = str(write_tarball(tree, work / f"{name}.tar.gz"))
    (tree / "MANIFEST.json").write_text(deep)
    f["m39_deep"] = str(write_tarball(tree, work / "m39_deep.tar.gz"))
    (tree / "MANIFEST.json").write_text(json.dumps(manifest))
    write("port.toml", 'recipe = "w4-mlp"\n[serve]\nargs = ["--quantization", "gptq_marlin", "--attention-backend", '
                       '"minicpm_flashinfer", "--cuda-graph-max-bs", "32", "--port", "8000"]\n'
                       '[[evidence]]\nkind = "none"\nsource = "sweep"\nsummary = "nothing measured"\n')
    write("deep.toml", '[quant]\nname = "deep"\nx = ' + "[" * 100_000 + "]" * 100_000 + "\n")
    write("many.toml", '[quant]\nname = "many"\nbits = 4\ngroup_size = 128\nsym = true\n'
                       '[calibration]\nrows = 100000000\n')
    rows = "".join(json.dumps({"task": t, "text": f"row {i} " + "word " * 30}) + "\n"
                   for i, t in enumerate(("niah", "qa", "mcq")))
    write("cal39.JSONL", rows)
    write("cal39.ndjson", rows)
    standin = work / "standin" / "sglang"
    standin.mkdir(parents=True)
    (standin / "__init__.py").write_text("")
    (standin / "launch_server.py").write_text(STUBBORN_LAUNCH_SERVER)
    f["standin_path"] = os.pathsep.join([str(standin.parent), os.environ.get("PYTHONPATH", "")])
    f["py"] = sys.executable
    import socket

    with socket.socket() as sock:  # a port nothing listens on, for the stand-in server that never gets healthy
        sock.bind(("127.0.0.1", 0))
        f["port39"] = str(sock.getsockname()[1])
    for name in ("tt", "tt4", "dot", "nb"):
        (work / name).mkdir()
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0:
        f["unshare"] = "unshare -rm"  # a private mount namespace: a small tmpfs to fill, as root of its own


# (id, command, surface, case, argv or a bash line (str), expected exit code, words the output must hold (a word
# starting with "!": text the output must not hold, e.g. a raw escape), env)
CASES = [
    ("T1", "tiny-model", "OUT", "an existing file", ["tiny-model", "{afile}"], 2, ["afile"], {}),
    ("T2", "tiny-model", "--pattern", "a letter other than S/L", ["tiny-model", "{w}/t2", "--pattern", "SQ"], 2, ["pattern"], {}),
    ("T3", "tiny-model", "--vocab", "a vocabulary too small for the tokenizer", ["tiny-model", "{w}/t3", "--vocab", "10"], 2, ["vocab"], {}),
    ("C1", "calib", "FILE", "a directory", ["calib", "{adir}", "--model-dir", "{tok}"], 2, ["is a directory"], {}),
    ("C2", "calib", "FILE", "/dev/zero", ["calib", "/dev/zero", "--model-dir", "{tok}"], 2, ["not text"], {}),
    ("C3", "calib", "FILE", "/dev/urandom", ["calib", "/dev/urandom", "--model-dir", "{tok}"], 2, ["not UTF-8"], {}),
    ("C4", "calib", "FILE", "cal.NDJSON, 3 rows", ["calib", "{cal_NDJSON}", "--model-dir", "{tok}", "--max-len", "64"], 0, ["3 rows"], {}),
    ("C5", "calib", "FILE", "a pipe, <(cat cal.jsonl)", "python -m soarpack calib <(cat {cal_jsonl}) --model-dir {tok} --max-len 64", 0, ["3 rows"], {}),
    ("C6", "calib", "FILE", "U+2028 and U+0085 inside a JSON string", ["calib", "{cal_ls_jsonl}", "--model-dir", "{tok}", "--max-len", "64"], 0, ["1 rows"], {}),
    ("C7", "calib", "FILE", "a whitespace-only row", ["calib", "{cal_ws_jsonl}", "--model-dir", "{tok}"], 2, ["only whitespace"], {}),
    ("C8", "calib", "--model-dir", "a chat template that raises", ["calib", "{q_jsonl}", "--model-dir", "{raising}", "--max-len", "64"], 2, ["chat template"], {}),
    ("C9", "calib", "--model-dir", "a folder without a tokenizer", ["calib", "{cal_jsonl}", "--model-dir", "{adir}"], 2, ["tokenizer"], {}),
    ("C10", "calib", "--model-dir", "a tokenizer larger than vocab_size", ["calib", "--model-dir", "{bigvocab}"], 2, ["vocab_size"], {}),
    ("C11", "calib", "--write-builtin", "a directory", ["calib", "--model-dir", "{tiny}", "--max-len", "64", "-n", "4", "--write-builtin", "{adir}"], 2, ["adir"], {}),
    ("Q1", "quantize", "--calib", "/dev/zero", ["quantize", "{tiny}", "{w}/q1", "--calib", "/dev/zero"], 2, ["not text"], {}),
    ("Q2", "quantize", "--recipe", "/dev/zero", ["quantize", "{tiny}", "{w}/q2", "--recipe", "/dev/zero"], 2, ["/dev/zero", "larger than"], {}),
    ("Q3", "quantize", "--recipe", "a directory", ["quantize", "{tiny}", "{w}/q3", "--recipe", "{adir}"], 2, ["adir"], {}),
    ("Q4", "quantize", "--calib", "a whitespace-only row", ["quantize", "{tiny}", "{w}/q4", "--calib", "{cal_ws_jsonl}"], 2, ["only whitespace"], {}),
    ("Q5", "quantize", "--held-out", "a missing file", ["quantize", "{tiny}", "{w}/q5", "--held-out", "{w}/nope.jsonl"], 2, ["nope.jsonl"], {}),
    ("Q6", "quantize", "MODEL_DIR", "a tokenizer larger than vocab_size", ["quantize", "{bigvocab}", "{w}/q6"], 2, ["vocab_size"], {}),
    ("Q7", "quantize", "--recipe", "non-UTF-8 bytes", ["quantize", "{tiny}", "{w}/q7", "--recipe", "{bad_toml}"], 2, ["UTF-8"], {}),
    ("V1", "verify", "CKPT", "a file", ["verify", "{afile}"], 2, ["afile"], {}),
    ("V2", "verify", "CKPT", "quantize_config.json a JSON list", ["verify", "{qclist}"], 1, ["quantize_config.json: a JSON list"], {}),
    ("V3", "verify", "--original", "a missing folder", ["verify", "{quantized}", "--original", "{w}/nope"], 1, ["nope", "no model.safetensors"], {}),
    ("S1", "serve-check", "CKPT", "a missing folder", ["serve-check", "{w}/nope", "--sglang-src", "{adir}", "--dev-stack"], 2, ["nope"], {}),
    ("S2", "serve-check", "CKPT", "an unquantized checkpoint", ["serve-check", "{tiny}", "--sglang-src", "{w}/nope", "--dev-stack"], 2, ["quantized checkpoint"], {}),
    ("S4", "serve-check", "--sglang-src", "a missing folder", ["serve-check", "{quantized}", "--sglang-src", "{w}/nope", "--dev-stack"], 2, ["nope"], {}),
    ("S3", "serve-check", "--profile", "/dev/zero", ["serve-check", "{quantized}", "--sglang-src", "{fork}", "--profile", "/dev/zero", "--dev-stack"], 2, ["/dev/zero", "larger than"], {}),
    ("P1", "profiles", "(none: packaged files)", "plain listing", ["profiles"], 0, ["safe"], {}),
    ("P2", "profiles", "(none)", "--json", ["profiles", "--json"], 0, ["args_string"], {}),
    ("P3", "profiles", "env SOARPACK_CACHE", "a file (not used by profiles)", ["profiles"], 0, ["safe"], {"SOARPACK_CACHE": "{cachefile}"}),
    ("A1", "args", "PROFILE", "an unknown name", ["args", "no-such-profile"], 2, ["no-such-profile"], {}),
    ("A2", "args", "PROFILE", "/dev/zero", ["args", "/dev/zero"], 2, ["/dev/zero", "larger than"], {}),
    ("A3", "args", "PROFILE", "non-UTF-8 bytes", ["args", "{bad_toml}"], 2, ["UTF-8"], {}),
    ("A4", "args", "--sglang-src", "a file", ["args", "safe", "--sglang-src", "{afile}"], 2, ["afile"], {}),
    ("B1", "build", "--calib", "a directory", ["build", "--no-wheels", "--calib", "{adir}", "-o", "{w}/b1.tar.gz"], 2, ["adir"], {}),
    ("B2", "build", "--calib", "/dev/zero", ["build", "--no-wheels", "--calib", "/dev/zero", "-o", "{w}/b2.tar.gz"], 2, ["/dev/zero", "not a regular file"], {}),
    ("B3", "build", "--calib", "a pipe, <(cat cal.jsonl)", "python -m soarpack build --no-wheels --calib <(cat {cal_jsonl}) -o {w}/b3.tar.gz", 2, ["not a regular file"], {}),
    ("B4", "build", "--calib", "cal.NDJSON (shipped, then counted by inspect)", "python -m soarpack build --no-wheels --calib {cal_NDJSON} -o {w}/b4.tar.gz >/dev/null && python -m soarpack inspect {w}/b4.tar.gz --json", 0, ['"rows": 3'], {}),
    ("B5", "build", "--recipe", "/dev/zero", ["build", "--no-wheels", "--recipe", "/dev/zero", "-o", "{w}/b5.tar.gz"], 2, ["/dev/zero", "larger than"], {}),
    ("B6", "build", "--wheel-dir", "a file", ["build", "--wheel-dir", "{afile}", "-o", "{w}/b6.tar.gz"], 2, ["afile"], {}),
    ("B7", "build", "env SOARPACK_CACHE", "a file, with wheels", ["build", "-o", "{w}/b7.tar.gz"], 2, ["cachefile", "SOARPACK_CACHE"], {"SOARPACK_CACHE": "{cachefile}"}),
    ("I1", "inspect", "BUNDLE", "an uncompressed tar named .tar.gz", ["inspect", "{plain_tar_gz}"], 2, ["not gzip"], {}),
    ("I2", "inspect", "BUNDLE", "an xz tar named .tar.gz", ["inspect", "{xz_tar_gz}"], 2, ["not gzip"], {}),
    ("I3", "inspect", "BUNDLE", "/dev/zero", ["inspect", "/dev/zero"], 2, ["not gzip"], {}),
    ("I4", "inspect", "archive member MANIFEST.json", "quantize is a string", ["inspect", "{badmanifest}"], 2, ["'quantize'"], {}),
    ("I5", "inspect", "archive member calib/*.jsonl", "a row holding U+2028 counted as one row", ["inspect", "{lsbundle}", "--json"], 0, ['"rows": 1'], {}),
    ("I6", "inspect", "BUNDLE", "a directory", ["inspect", "{adir}"], 2, ["adir"], {}),
    ("K1", "check", "BUNDLE", "an xz tar named .tar.gz", ["check", "{xz_tar_gz}", "--no-rehearse"], 1, ["FAIL extract", "not gzip"], {}),
    ("K2", "check", "--keep", "an existing file", ["check", "{bundle}", "--no-rehearse", "--keep", "{afile}"], 2, ["afile"], {}),
    ("K3", "check", "--sglang-src", "a missing folder", ["check", "{bundle}", "--sglang-src", "{w}/nope"], 2, ["nope"], {}),
    ("K4", "check", "archive member MANIFEST.json", "profile is a string", ["check", "{badprofile}", "--no-rehearse"], 1, ["FAIL structure", "'profile'"], {}),
    ("K5", "check", "BUNDLE", "/dev/zero", ["check", "/dev/zero", "--no-rehearse"], 1, ["FAIL size"], {}),
    ("K6", "check", "env SOARPACK_CACHE", "a file (the image stand-in cannot be cached)", ["check", "{bundle}"], 2, ["cachefile", "SOARPACK_CACHE"], {"SOARPACK_CACHE": "{cachefile}"}),
    ("E1", "eval", "--data", "a directory", ["eval", "-o", "{w}/e1.json", "--api-base", "{api}", "--data", "{adir}"], 2, ["is a directory"], {}),
    ("E2", "eval", "--data", "/dev/zero", ["eval", "-o", "{w}/e2.json", "--api-base", "{api}", "--data", "/dev/zero"], 2, ["NUL"], {}),
    ("E3", "eval", "--data", "/dev/urandom", ["eval", "-o", "{w}/e3.json", "--api-base", "{api}", "--data", "/dev/urandom"], 2, ["/dev/urandom"], {}),
    ("E4", "eval", "--data", "a pipe, <(cat data.jsonl)", "python -m soarpack eval --api-base {api} --data <(cat {data_jsonl}) -o {w}/e4.json --json", 0, ['"ori_accuracy": 100.0'], {}),
    ("E5", "eval", "--data", "U+2028 inside a question", ["eval", "--api-base", "{api}", "--data", "{data_ls_jsonl}", "-o", "{w}/e5.json", "--json"], 0, ['"scored": 1'], {}),
    ("E6", "eval", "--data", "a whitespace-only question", ["eval", "-o", "{w}/e6.json", "--api-base", "{api}", "--data", "{data_ws_jsonl}"], 2, ["only whitespace"], {}),
    ("E7", "eval", "-o", "a JSON list", ["eval", "--api-base", "{api}", "--data", "{data_jsonl}", "-o", "{list_json}"], 2, ["list.json"], {}),
    ("E8", "eval", "-o", "a resumed file with a score edited to 50", ["eval", "--api-base", "{api}", "--data", "{data_jsonl}", "-o", "{edited}", "--json"], 0, ['"ori_accuracy": 100.0'], {}),
    ("E9", "eval", "server reply", "/v1/models answers HTML", ["eval", "-o", "{w}/e9.json", "--api-base", "{html}", "--data", "{data_jsonl}"], 2, ["lists no model"], {}),
    ("E10", "eval", "--model-dir", "a folder without a tokenizer", ["eval", "-o", "{w}/e10.json", "--api-base", "{api}", "--data", "{data_jsonl}", "--model-dir", "{adir}"], 2, ["tokenizer"], {}),
    ("E11", "eval", "--bundle", "MANIFEST.json quantize is a string", ["eval", "-o", "{w}/e11.json", "--api-base", "{api}", "--data", "{data_jsonl}", "--bundle", "{badmanifest}"], 2, ["'quantize'"], {}),
    ("E12", "eval", "env HTTP_PROXY", "a dead proxy (ignored: trust_env off)", ["eval", "--api-base", "{api}", "--data", "{data_jsonl}", "-o", "{w}/e12.json", "--json"], 0, ['"scored": 3'], {"HTTP_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9"}),
    ("N1", "bench", "--s1", "/dev/zero", ["bench", "--api-base", "{api}", "--s1", "/dev/zero", "--model-dir", "{tok}"], 2, ["NUL"], {}),
    ("N2", "bench", "--s1", "a directory", ["bench", "--api-base", "{api}", "--s1", "{adir}", "--model-dir", "{tok}"], 2, ["is a directory"], {}),
    ("N3", "bench", "--s1", "U+2028 inside a question", ["bench", "--api-base", "{api}", "--s1", "{speed_ls_jsonl}", "--model-dir", "{tok}", "--no-flush", "--json"], 0, ['"failed": 0'], {}),
    ("N4", "bench", "server reply", "/v1/models answers HTML", ["bench", "--api-base", "{html}", "--s1", "{speed_jsonl}", "--model-dir", "{tok}"], 2, ["lists no model"], {}),
    ("N5", "bench", "--model-dir", "a missing folder", ["bench", "--api-base", "{api}", "--s1", "{speed_jsonl}", "--model-dir", "{w}/nope"], 2, ["nope"], {}),
    ("D1", "speedset", "--text", "/dev/zero", ["speedset", "--model-dir", "{tok}", "-n", "2", "-o", "{w}/d1.jsonl", "--text", "/dev/zero"], 2, ["/dev/zero"], {}),
    ("D2", "speedset", "--mix", "/dev/zero", ["speedset", "--model-dir", "{tok}", "-n", "2", "-o", "{w}/d2.jsonl", "--mix", "/dev/zero"], 2, ["/dev/zero"], {}),
    ("D3", "speedset", "--text", "a directory", ["speedset", "--model-dir", "{tok}", "-n", "2", "-o", "{w}/d3.jsonl", "--text", "{adir}"], 2, ["adir"], {}),
    ("D4", "speedset", "--model-dir", "a missing folder", ["speedset", "--model-dir", "{w}/nope", "-n", "2", "-o", "{w}/d4.jsonl"], 2, ["nope"], {}),
    ("R1", "score", "--ours", "/dev/zero", ["score", "--ours", "/dev/zero", "--best-s1", "1", "--best-s8", "1", "--best-smax", "1"], 2, ["/dev/zero"], {}),
    ("R2", "score", "--ours", "a directory", ["score", "--ours", "{adir}", "--best-s1", "1", "--best-s8", "1", "--best-smax", "1"], 2, ["adir"], {}),
    ("R3", "score", "--eval", "a JSON list", ["score", "--ours", "{list_json}", "--eval", "{list_json}", "--best-s1", "1", "--best-s8", "1", "--best-smax", "1"], 2, ["list.json"], {}),
    ("R4", "score", "--best", "/dev/urandom", ["score", "--ours", "{list_json}", "--best", "/dev/urandom"], 2, ["/dev/urandom"], {}),
    ("M1", "compare", "RESULTS", "/dev/zero", ["compare", "/dev/zero"], 2, ["/dev/zero"], {}),
    ("M2", "compare", "RESULTS", "a directory", ["compare", "{adir}"], 2, ["adir"], {}),
    ("M3", "compare", "RESULTS", "a JSON list", ["compare", "{list_json}"], 2, ["list.json"], {}),
    ("H1", "rehearse-server", "CKPT", "a missing folder", ["rehearse-server", "{w}/nope", "--data", "{data_jsonl}", "--python", "/nonexistent/python"], 2, ["nope"], {}),
    ("H2", "rehearse-server", "--python", "a missing interpreter", ["rehearse-server", "{tiny}", "--data", "{data_jsonl}", "--python", "/nonexistent/python", "-o", "{w}/h2"], 2, ["/nonexistent/python"], {}),
    ("H3", "rehearse-server", "--profile", "/dev/zero", ["rehearse-server", "{tiny}", "--data", "{data_jsonl}", "--profile", "/dev/zero", "-o", "{w}/h3"], 2, ["/dev/zero", "larger than"], {}),
    ("H4", "rehearse-server", "--data", "/dev/zero", ["rehearse-server", "{tiny}", "--data", "/dev/zero", "--python", "/nonexistent/python", "-o", "{w}/h4"], 2, ["/dev/zero"], {}),
    ("G1", "sglang check", "--sglang-src", "a missing folder", ["sglang", "check", "--sglang-src", "{w}/nope"], 2, ["nope"], {}),
    ("G2", "sglang check", "--sglang-src", "a file", ["sglang", "check", "--sglang-src", "{afile}"], 2, ["afile"], {}),
    ("G3", "sglang check", "--patch", "an unknown name", ["sglang", "check", "--sglang-src", "{fork}", "--patch", "nope"], 2, ["nope"], {}),
    ("G4", "sglang apply", "--sglang-src", "a missing folder", ["sglang", "apply", "--sglang-src", "{w}/nope", "-o", "{w}/g4"], 2, ["nope"], {}),
    ("G5", "sglang apply", "-o", "an existing file", ["sglang", "apply", "--sglang-src", "{fork}", "-o", "{afile}"], 2, ["afile"], {}),
    ("G6", "sglang apply", "--patch", "an unknown name", ["sglang", "apply", "--sglang-src", "{fork}", "-o", "{w}/g6", "--patch", "nope"], 2, ["nope"], {}),
    ("G7", "sglang list", "(none: packaged patches)", "plain listing", ["sglang", "list"], 0, ["fp8"], {}),
    ("G8", "sglang list", "(none)", "env SOARPACK_CACHE a file (not used)", ["sglang", "list"], 0, ["fp8"], {"SOARPACK_CACHE": "{cachefile}"}),
    ("G9", "sglang list", "(none)", "an unknown option", ["sglang", "list", "--nope"], 2, ["--nope"], {}),
    ("W1", "wheels fetch", "env SOARPACK_CACHE", "a file", ["wheels", "fetch"], 2, ["cachefile", "SOARPACK_CACHE"], {"SOARPACK_CACHE": "{cachefile}"}),
    ("W2", "wheels fetch", "env XDG_CACHE_HOME", "a file", ["wheels", "fetch"], 2, ["cachefile"], {"XDG_CACHE_HOME": "{cachefile}", "SOARPACK_CACHE": ""}),
    ("W3", "wheels fetch", "env HOME", "a file, no other cache variable", ["wheels", "fetch"], 2, ["cachefile"], {"HOME": "{cachefile}", "XDG_CACHE_HOME": "", "SOARPACK_CACHE": ""}),
    # issue 39, part B
    ("R39a", "score", "--best-s1", "a best time slower than ours (S capped at 100, said)", ["score", "--ours", "{b39_ours_json}", "--best-s1", "20", "--best-s8", "20", "--best-smax", "30"], 0, ["S capped at 100 for s1"], {}),
    ("R39b", "score", "--ours", "a subnormal duration", ["score", "--ours", "{b39_sub_json}", "--best-s1", "5", "--best-s8", "5", "--best-smax", "5"], 2, ["s1 duration_s is not a positive finite number"], {}),
    ("R39c", "score", "--best-s1", "a subnormal best time", ["score", "--ours", "{b39_ours_json}", "--best-s1", "5e-324", "--best-s8", "5", "--best-smax", "5"], 2, ["best duration for s1 is not a positive finite number"], {}),
    ("R39d", "score", "--eval", "overall_accuracy NaN", ["score", "--ours", "{b39_ours_json}", "--eval", "{e39_nan_json}", "--best-s1", "10", "--best-s8", "20", "--best-smax", "30"], 2, ["overall_accuracy is nan"], {}),
    ("R39e", "score", "--eval", "overall_accuracy a string", ["score", "--ours", "{b39_ours_json}", "--eval", "{e39_str_json}", "--best-s1", "10", "--best-s8", "20", "--best-smax", "30"], 2, ["overall_accuracy is 'high'"], {}),
    ("R39f", "score", "--ours", "JSON nested 100,000 deep", ["score", "--ours", "{deep_json}", "--best-s1", "1", "--best-s8", "1", "--best-smax", "1"], 2, ["nested too deep"], {}),
    ("E39a", "eval", "-o", "an existing output of JSON nested 100,000 deep", ["eval", "--api-base", "{api}", "--data", "{data_jsonl}", "-o", "{deep_json}"], 2, ["exists but is not JSON"], {}),
    ("M39a", "compare", "RESULTS", "eval and bench of different models under one label", ["compare", "{e39_mine}", "{b39_other_json}"], 0, ["joins results of different served models"], {}),
    ("M39b", "compare", "RESULTS", "overall_accuracy NaN", ["compare", "{e39_nan_json}"], 2, ["overall_accuracy is nan"], {}),
    ("M39c", "compare", "RESULTS", "JSON nested 100,000 deep", ["compare", "{deep_json}"], 2, ["deep.json"], {}),
    ("I39a", "inspect", "archive member MANIFEST.json", "format 1.0", ["inspect", "{m39_fmt10}"], 2, ["format 1.0 is not one"], {}),
    ("I39b", "inspect", "archive member MANIFEST.json", "format true", ["inspect", "{m39_fmttrue}"], 2, ["format True is not one"], {}),
    ("I39c", "inspect", "archive member MANIFEST.json", "calibration rows_asked NaN", ["inspect", "{m39_calnan}"], 2, ["calibration", "rows_asked"], {}),
    ("I39d", "inspect", "archive member MANIFEST.json", "a calibration source of -1 rows", ["inspect", "{m39_calneg}"], 2, ["calibration", "rows"], {}),
    ("I39e", "inspect", "archive member MANIFEST.json", "JSON nested 100,000 deep", ["inspect", "{m39_deep}"], 2, ["nested too deep"], {}),
    ("K39a", "check", "archive member MANIFEST.json", "extra_args --rows 8 against the 256 recorded", ["check", "{m39_extra8}", "--no-rehearse"], 1, ["FAIL structure", "--rows 8"], {}),
    ("K39b", "check", "(no BUNDLE)", "an older bundle with a future mtime beside a new one", "cd {w}/nb && cp {bundle} soarpack-a-old.tar.gz && touch -d '+1 day' soarpack-a-old.tar.gz && cp {bundle} soarpack-b-new.tar.gz && python -m soarpack check --no-rehearse", 2, ["which is newest is unclear"], {}),
    ("A39a", "args", "PROFILE", "a profile that sets --port (ours wins: an error)", ["args", "{port_toml}"], 2, ["platform-flag-wins", "ours wins"], {}),
    ("A39b", "args", "PROFILE", "TOML nested 100,000 deep", ["args", "{deep_toml}"], 2, ["nested more than 64 levels"], {}),
    ("Q39a", "quantize", "--recipe", "TOML nested 100,000 deep", ["quantize", "{tiny}", "{w}/q39a", "--recipe", "{deep_toml}"], 2, ["nested more than 64 levels"], {}),
    ("Q39b", "quantize", "OUT", "the current folder, --force", "cd {w}/dot && python -m soarpack quantize {tiny} . --force --rows 8 --max-len 64", 2, ["is the current folder"], {}),
    ("Q39c", "quantize", "--log", "a full disk (a 4 KiB tmpfs)", "{unshare} sh -c 'mount -t tmpfs -o size=4k tmpfs {w}/tt4 && python -m soarpack quantize {tiny} {w}/q39c --log {w}/tt4/q.log --rows 8 --max-len 64'", 2, ["no space left on the device"], {}),
    ("Q39d", "quantize", "--rows", "100,000,000 built-in rows", ["quantize", "{tiny}", "{w}/q39d", "--rows", "100000000"], 2, ["would not fit in one calibration file"], {}),
    ("C39a", "calib", "FILE", "cal39.JSONL, 3 rows counted as 3", ["calib", "{cal39_JSONL}", "--model-dir", "{tok}", "--max-len", "64"], 0, ["cal39.JSONL (3 rows)"], {}),
    ("C39b", "calib", "-n", "100,000,000 built-in rows", ["calib", "--model-dir", "{tok}", "-n", "100000000", "--max-len", "64"], 2, ["would not fit in one calibration file"], {}),
    ("B39a", "build", "-n", "100,000,000 built-in rows", ["build", "--no-wheels", "-n", "100000000", "-o", "{w}/b39a.tar.gz"], 2, ["would not fit in one calibration file"], {}),
    ("B39b", "build", "--recipe", "[calibration] rows = 100,000,000", ["build", "--no-wheels", "--recipe", "{many_toml}", "-o", "{w}/b39b.tar.gz"], 2, ["recipe many's [calibration]"], {}),
    ("B39c", "build", "--calib", "cal39.ndjson, -n 3: no false calib-short", "python -m soarpack build --no-wheels --calib {cal39_ndjson} -n 3 -o {w}/b39c.tar.gz >/dev/null && python -m soarpack inspect {w}/b39c.tar.gz --json | {py} -c \"import json, sys; r = [x['name'] for x in json.load(sys.stdin)['risks']]; print('risks:', r); sys.exit(3 if 'calib-short' in r else 0)\"", 0, ["risks:"], {}),
    ("B39d", "build", "--profile", "a profile that sets --port", ["build", "--no-wheels", "--profile", "{port_toml}", "-o", "{w}/b39d.tar.gz"], 2, ["platform-flag-wins"], {}),
    ("H39a", "rehearse-server", "--ready-timeout", "nan", ["rehearse-server", "{tiny}", "--data", "{data_jsonl}", "--ready-timeout", "nan", "-o", "{w}/h39a"], 2, ["--ready-timeout nan is not a time"], {}),
    ("H39b", "rehearse-server", "--max-tokens", "1", ["rehearse-server", "{tiny}", "--data", "{data_jsonl}", "--max-tokens", "1", "-o", "{w}/h39b"], 2, ["--max-tokens 1 is below"], {}),
    ("H39c", "rehearse-server", "SIGTERM", "a server child that ignores SIGTERM is killed too", "rm -f {w}/child.pid; python -m soarpack rehearse-server {tiny} --data {data_jsonl} --ready-timeout 300 --port {port39} -o {w}/h39c & pid=$!; for i in $(seq 600); do [ -s {w}/child.pid ] && break; sleep 0.1; done; if ! [ -s {w}/child.pid ]; then kill $pid; echo 'the stand-in server never started'; exit 4; fi; kill -TERM $pid; wait $pid; for i in $(seq 100); do kill -0 $(cat {w}/child.pid) 2>/dev/null || break; sleep 0.1; done; if kill -0 $(cat {w}/child.pid) 2>/dev/null && ! grep -q '^State:.Z' /proc/$(cat {w}/child.pid)/status; then kill -9 $(cat {w}/child.pid); echo 'a server child still runs'; exit 3; fi; echo 'server child gone'", 0, ["server child gone"], {"PYTHONPATH": "{standin_path}", "STUBBORN_PIDFILE": "{w}/child.pid", "_timeout_s": "150"}),
    ("G39a", "sglang apply", "-o", "a full disk (a 1 MiB tmpfs)", "{unshare} sh -c 'mount -t tmpfs -o size=1m tmpfs {w}/tt && python -m soarpack sglang apply --sglang-src {fork} -o {w}/tt/out'", 2, ["no space left on the device"], {}),
]


# -- issue 39, part A: cache data loss, terminal escapes, secrets that shipped, diagnose, inspect --steps ---------------

ESC_PAYLOAD = "\x1b[2J\x1b]0;pwned\x07\x9b31m\u202e"  # clear screen, a window title, BEL, a C1 CSI, a bidi override
ESC_NAME = "evil" + ESC_PAYLOAD
HF_TOKEN = "hf_" + "Ab3" * 12
RAW_ESC = ["!\x1b[2J", "!\x07", "!\u202e"]  # what must never reach the output raw


def fixtures_h39a(work: Path, f: dict) -> None:
    import gzip
    import io
    import os

    from soarpack.measure.evaluate import EVAL_KIND
    from soarpack.bundle.build import build_bundle
    from soarpack.bundle.tarpack import safe_extract, write_tarball
    from soarpack.bundle.wheels import make_pure_wheel
    from soarpack.cachemark import mark
    from soarpack.imagestack import stack_dir

    h = work / "h39a"
    h.mkdir()

    def tar_gz(members):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def user_things(folder):
        (folder / "Documents").mkdir(parents=True)
        (folder / "Documents" / "thesis.tex").write_text("years of work\n")
        (folder / "wheels").mkdir()
        (folder / "wheels" / "mine.whl").write_bytes(b"mine")
    # cache roots: a home, a / laid out around a home, a shared folder, an older soarpack's cache
    user_things(h / "home")
    f["h_home"] = str(h / "home")
    (h / "slash" / "etc").mkdir(parents=True)
    user_things(h / "slash" / "home" / "me")
    f["h_slash"], f["h_slash_home"] = str(h / "slash"), str(h / "slash" / "home" / "me")
    user_things(h / "shared")
    (h / "shared" / "gpu-serve").mkdir()
    mark(h / "shared" / "gpu-serve", "gpu-serve")
    f["h_shared"] = str(h / "shared")
    old = h / "oldcache"
    key = stack_dir().name
    (old / "image-stack" / key / "bin").mkdir(parents=True)
    (old / "image-stack" / key / ".soarpack-ready.json").write_text("{}")
    f["h_old"] = str(old)
    (h / "esccache" / ESC_NAME).mkdir(parents=True)
    f["h_esccache"] = str(h / "esccache")
    # logs for diagnose
    logs = h / "logs"
    logs.mkdir()
    (logs / f"{ESC_NAME}.log").write_text(f"RuntimeError: boom {ESC_PAYLOAD}\n")
    f["h_esclogs"] = str(logs)
    workers = "ValueError: Virtual pool 'model_loader:cpu' requests 2 workers but parent 'cpu' only has 1"
    with (h / "long.log").open("w") as fh:
        fh.write(workers + "\n")
        line = "INFO all is well " * 10 + "\n"
        fh.write(line * (33 * 2**20 // len(line)))
    f["h_long"] = str(h / "long.log")
    many = h / "many"
    many.mkdir()
    for i in range(503):
        (many / f"r{i:03d}.log").write_text("INFO fine\n")
    f["h_many"] = str(many)
    (h / "quoted.log").write_text(f"WARNING retry: saw \"{workers[12:]}\", retrying\n"
                                  "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    f["h_quoted"] = str(h / "quoted.log")
    (h / "retry.log").write_text("server not ready yet, retrying in 5 s\nserver is up\neval done: 150 rows\n")
    f["h_retry"] = str(h / "retry.log")
    (h / "malformed.json").write_text(json.dumps({"kind": EVAL_KIND, "rows": "oops"}))
    f["h_malformed"] = str(h / "malformed.json")
    os.mkfifo(h / "fifo.log")
    f["h_fifo"] = str(h / "fifo.log")
    os.symlink("/dev/zero", h / "zero.json")
    f["h_zero"] = str(h / "zero.json")
    big = h / "big"
    big.mkdir()
    line = "INFO quantizing layer 3 of 32: loss 0.0123, all is well here, nothing to report\n"
    (big / "one.log").write_text(line * (2**20 // len(line)))
    for i in range(119):
        os.link(big / "one.log", big / f"run{i:03d}.log")
    f["h_big"] = str(big)
    (h / "deep.json").write_text('{"kind": "%s", "rows": ' % EVAL_KIND + "[" * 100_000 + "]" * 100_000 + "}")
    f["h_deep"] = str(h / "deep.json")
    # bundles: a hostile calibration name; prepare_env.sh replaced (escapes, a here-document, eval, declare -x)
    calib = h / f"{ESC_NAME}.jsonl"
    calib.write_text(json.dumps({"text": "prose " * 40}) + "\n")
    f["h_esccalib"] = str(calib)
    bundle = build_bundle(h / "esc.tar.gz", wheels=False, calib=[calib], calib_rows=8).path
    f["h_escbundle"] = str(bundle)
    tree = safe_extract(bundle, h / "tree")
    scripts = {"escsteps": f"# {ESC_PAYLOAD}\nexport EVIL=\"{ESC_PAYLOAD}\"\n",
               "heredoc": "cat <<EOF\nexport FAKE_EXPORT=1\nEOF\nexport REAL=2\n",
               "evalsteps": "eval 'export HIDDEN=1'\n", "declare": "declare -x DECLARED=6\n"}
    for name, text in scripts.items():
        (tree / "prepare_env.sh").write_text(text)
        f[f"h_{name}"] = str(write_tarball(tree, h / f"{name}.tar.gz"))
    # secrets: in a fork tree build ships as it is (--sglang-src), in an upload check reads, in a wheel
    secret = f"token {HF_TOKEN}\n".encode()
    for name, data in {"gz": gzip.compress(secret, mtime=0), "tgz": tar_gz({"in/s.txt": secret}),
                       "u16": secret.decode().encode("utf-16"), "bomb": gzip.compress(bytes(16 << 20), 1, mtime=0) * 64}.items():
        src = h / f"fork-{name}"
        (src / "sglang").mkdir(parents=True)
        (src / "sglang" / "__init__.py").write_text("")
        (src / "sglang" / f"data.{name}").write_bytes(data)
        f[f"h_fork_{name}"] = str(src)
    (h / "tokname").mkdir()
    (h / "tokname" / f"calib-{HF_TOKEN}.txt").write_text("prose\n")
    f["h_tokname"] = str(h / "tokname" / f"calib-{HF_TOKEN}.txt")
    up = h / "uptree"
    shutil.copytree(tree, up)
    (up / "calib" / "extra.gz").write_bytes(gzip.compress(secret, mtime=0))
    f["h_upload"] = str(write_tarball(up, h / "upload.tar.gz"))
    wheels = h / "wh"
    wheel = make_pure_wheel(wheels, "evil", "1.0", {"evil/__init__.py": ""})
    import zipfile

    with zipfile.ZipFile(wheel, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("evil/fixtures.tar.gz", tar_gz({"conf.txt": secret}))
    f["h_wheels"] = str(wheels)
    esc_fork = h / f"fork{ESC_NAME}"
    (esc_fork / "sglang" / "srt").mkdir(parents=True)
    (esc_fork / "sglang" / "__init__.py").write_text("")
    f["h_escfork"] = str(esc_fork)


_HOME = {"SOARPACK_CACHE": "{h_home}", "HOME": "{h_home}"}
CASES_H39A = [
    ("HA1", "cache clear", "env SOARPACK_CACHE", "the home folder (a sandbox HOME)", "python -m soarpack cache clear --yes; rc=$?; test -f {h_home}/Documents/thesis.tex && test -f {h_home}/wheels/mine.whl && echo kept-rc=$rc", 0, ["is the home folder", "kept-rc=2"], _HOME),
    ("HA2", "cache clear", "env SOARPACK_CACHE", "a /-like folder holding HOME", "python -m soarpack cache clear --yes; rc=$?; test -f {h_slash_home}/Documents/thesis.tex && echo kept-rc=$rc", 0, ["a parent of the home folder", "kept-rc=2"], {"SOARPACK_CACHE": "{h_slash}", "HOME": "{h_slash_home}"}),
    ("HA3", "cache clear", "env SOARPACK_CACHE", "a shared folder: the user's wheels/ and soarpack's gpu-serve", "python -m soarpack cache clear --yes; rc=$?; test -f {h_shared}/wheels/mine.whl && test ! -e {h_shared}/gpu-serve && echo kept-rc=$rc", 0, ["kept wheels", "kept-rc=1"], {"SOARPACK_CACHE": "{h_shared}", "HOME": "{w}"}),
    ("HA4", "cache clear", "env SOARPACK_CACHE", "a stand-in an older soarpack made (no marker)", ["cache", "clear", "--yes"], 1, ["made it before markers existed", "rm -rf --"], {"SOARPACK_CACHE": "{h_old}", "HOME": "{w}"}),
    ("HA5", "cache list", "cache entry name", "a name that is terminal escapes", ["cache", "list"], 0, ["\\x1b[2J", *RAW_ESC], {"SOARPACK_CACHE": "{h_esccache}"}),
    ("HA6", "diagnose", "LOG_OR_DIR", "a log named and filled with terminal escapes", ["diagnose", "{h_esclogs}"], 0, ["\\x1b[2J", *RAW_ESC], {}),
    ("HA7", "inspect", "BUNDLE", "a calibration file named with terminal escapes", ["inspect", "{h_escbundle}"], 0, ["\\x1b[2J", *RAW_ESC], {}),
    ("HA8", "inspect --steps", "archive member prepare_env.sh", "an exported value and a comment that are escapes", ["inspect", "--steps", "{h_escsteps}"], 0, ["\\x1b[2J", *RAW_ESC], {}),
    ("HA9", "calib", "FILE", "a file named with terminal escapes", ["calib", "{h_esccalib}", "--model-dir", "{tok}", "--max-len", "64", "-n", "1"], 0, ["\\x1b[2J", *RAW_ESC], {}),
    ("HA10", "sglang check", "--sglang-src", "a tree named with terminal escapes", ["sglang", "check", "--sglang-src", "{h_escfork}"], 2, ["\\x1b[2J", *RAW_ESC], {}),
    ("HA11", "build", "--sglang-src", "a .gz holding a token", ["build", "--no-wheels", "--profile", "safe", "--sglang-src", "{h_fork_gz}", "-o", "{w}/ha11.tar.gz"], 2, ["refusing to bundle", "Hugging Face token", "!" + HF_TOKEN], {}),
    ("HA12", "build", "--sglang-src", "a .tar.gz holding a token", ["build", "--no-wheels", "--profile", "safe", "--sglang-src", "{h_fork_tgz}", "-o", "{w}/ha12.tar.gz"], 2, ["refusing to bundle", "in/s.txt"], {}),
    ("HA13", "build", "--sglang-src", "a UTF-16 file holding a token", ["build", "--no-wheels", "--profile", "safe", "--sglang-src", "{h_fork_u16}", "-o", "{w}/ha13.tar.gz"], 2, ["refusing to bundle", "in 16-bit text"], {}),
    ("HA14", "build", "--calib", "a file name holding a token", ["build", "--no-wheels", "--calib", "{h_tokname}", "-o", "{w}/ha14.tar.gz"], 2, ["name that holds what looks like", "!" + HF_TOKEN], {}),
    ("HA15", "check", "BUNDLE member", "a .gz holding a token", ["check", "{h_upload}", "--no-rehearse"], 1, ["FAIL credentials"], {}),
    ("HA16", "build", "--sglang-src", "a gzip bomb (1 GiB of zeros)", ["build", "--no-wheels", "--profile", "safe", "--sglang-src", "{h_fork_bomb}", "-o", "{w}/ha16.tar.gz"], 2, ["expands past"], {}),
    ("HA17", "build", "--wheel-dir", "a wheel holding a .tar.gz holding a token", ["build", "--wheel-dir", "{h_wheels}", "-o", "{w}/ha17.tar.gz"], 2, ["evil/fixtures.tar.gz!fixtures.tar!conf.txt"], {}),
    ("HA18", "diagnose", "LOG_OR_DIR", "a 33 MiB log whose failure is at the start", ["diagnose", "{h_long}"], 0, ["not read:", "only its last 32 MiB were read"], {}),
    ("HA19", "diagnose", "LOG_OR_DIR", "a folder of 503 logs", ["diagnose", "{h_many}"], 0, ["stopped after 500 files"], {}),
    ("HA20", "diagnose", "LOG_OR_DIR", "a warning quoting a signature, then the real error", ["diagnose", "{h_quoted}"], 0, ["NOT A VERDICT", "illegal memory access"], {}),
    ("HA21", "diagnose", "LOG_OR_DIR", "a successful log's retry line (an unverified pattern)", ["diagnose", "{h_retry}"], 0, ["NOT A VERDICT"], {}),
    ("HA22", "diagnose", "LOG_OR_DIR", "an eval result whose rows are a string", ["diagnose", "{h_malformed}"], 1, ["result-malformed"], {}),
    ("HA23", "diagnose", "LOG_OR_DIR", "a FIFO with no writer", ["diagnose", "{h_fifo}"], 0, ["a pipe that gave nothing to read"], {}),
    ("HA24", "diagnose", "LOG_OR_DIR", "/dev/zero through a symlink named .json", ["diagnose", "{h_zero}"], 2, ["is a character device"], {}),
    ("HA25", "diagnose", "LOG_OR_DIR", "120 logs of 1 MiB in 195 MiB of address space", "ulimit -v 200000; python -m soarpack diagnose {h_big}", 0, ["no known failure"], {}),
    ("HA26", "diagnose", "LOG_OR_DIR", "an eval result nested 100,000 deep", ["diagnose", "{h_deep}"], 2, ["nested too deep"], {}),
    ("HA27", "inspect --steps", "archive member prepare_env.sh", "an export inside a here-document", ["inspect", "--steps", "{h_heredoc}"], 0, ["export REAL=2", "!FAKE_EXPORT"], {}),
    ("HA28", "inspect --steps", "archive member prepare_env.sh", "an export behind eval", ["inspect", "--steps", "{h_evalsteps}"], 0, ["could not read line 1: eval"], {}),
    ("HA29", "inspect --steps", "archive member prepare_env.sh", "declare -x", ["inspect", "--steps", "{h_declare}"], 0, ["export DECLARED=6"], {}),
]
CASES += CASES_H39A


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


def run_case(case, fx: dict, python: str) -> dict:
    cid, command, surface, what, argv, code, words, env_over = case
    for needs, why in (("fork", "no fork archive beside the checkout"), ("unshare", "`unshare -rm` (a private tmpfs) is not allowed here")):
        if "{" + needs + "}" in json.dumps(argv) and needs not in fx:
            return {"id": cid, "command": command, "surface": surface, "case": what, "expected": code, "rc": None,
                    "observed": f"not run ({why})", "seconds": 0, "last": ""}
    env = dict(os.environ)
    timeout_s = int(env_over.get("_timeout_s", TIMEOUT_S))  # a case that waits out a 30 s grace needs longer
    for key, value in env_over.items():
        if not key.startswith("_"):
            env[key] = value.format(**fx)
    if isinstance(argv, str):
        cmd = ["bash", "-c", argv.format(**fx).replace("python -m soarpack", f"{python} -m soarpack")]
    else:
        cmd = [python, "-m", "soarpack", *[a.format(**fx) for a in argv]]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, preexec_fn=_limit, env=env,
                              cwd=fx["w"], errors="replace")
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = None, (exc.stdout or b"").decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    seconds = time.monotonic() - start
    flat = " ".join(out.split())
    if rc is None:
        observed = "HANG"
    elif "Traceback (most recent call last)" in out:
        observed = "TB"
    elif rc == code and all(w[1:] not in out if w.startswith("!") else w in flat for w in words):
        observed = "ok"
    elif rc == 0:
        observed = "SW"
    else:
        observed = f"exit {rc}"
    last = [ln for ln in out.splitlines() if ln.strip()]
    said = [ln for ln in last if ln.startswith(("error:", "FAIL ")) or "Error:" in ln.split(" ", 1)[0]]
    last = said or last  # the error (or failed step) line when there is one, else the last line
    return {"id": cid, "command": command, "surface": surface, "case": what, "expected": code, "rc": rc,
            "observed": observed, "seconds": round(seconds, 1), "last": last[-1][:160] if last else ""}


def main() -> int:
    python = sys.executable
    work = Path(tempfile.mkdtemp(prefix="soarpack-input-sweep-"))
    try:
        fx = fixtures(work)
        fixtures_h39a(work, fx)
        only = set(sys.argv[1:])
        results = [run_case(c, fx, python) for c in CASES if not only or c[0] in only]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| id | command | surface | case | expected exit | result | last line |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['id']} | {r['command']} | {r['surface']} | {r['case']} | {r['expected']} | {r['observed']} "
              f"(exit {r['rc']}, {r['seconds']} s) | {r['last'].replace('|', '/')} |")
    bad = [r["id"] for r in results if r["observed"] != "ok"]
    print(f"\n{len(results) - len(bad)}/{len(results)} as expected; not: {', '.join(bad) or 'none'}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
