"""Libraries emit, the CLI renders: a tiny-model quantize and a development-stack `check`, called from Python in a
fresh interpreter, write nothing to file descriptors 1 and 2 (not even the libraries' banners); the same through
the package-root API (`soarpack.quantize(...)`), with fds 1 and 2 redirected to files; build, check, inspect, eval,
bench, score, compare and diagnose the same, fast; and no function under soarpack/ outside soarpack/cli/ prints,
writes to sys.stdout or sys.stderr, or makes a rich Console (read from the source)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ast

import pytest


SCRIPT = r'''
import sys
from pathlib import Path

from soarpack.bundle.build import build_bundle
from soarpack.bundle.wheels import make_pure_wheel
from soarpack.quant.options import quantize_options
from soarpack.quant.run import quantize
from soarpack.rehearse.check import check_bundle
from soarpack.sala.tiny import make_tiny_model

work = Path(sys.argv[1])
tiny = make_tiny_model(work / "tiny", num_layers=2)
result = quantize(tiny, work / "q", quantize_options(recipe="w4-full", rows=8, max_len=64, device="cpu"))
make_pure_wheel(work / "wheels", "soarpack-ci-probe", "1.0", {"soarpack_ci_probe.py": "X = 1\n"})
bundle = build_bundle(work / "b.tar.gz", wheel_dir=work / "wheels", calib_rows=16).path
report = check_bundle(bundle, dev_stack=True)
failed = [(s.name, s.detail) for s in report.steps if s.status == "fail"]
(work / "result.txt").write_text(f"{result.quantized_modules} {report.ok} {failed}")
'''


@pytest.mark.slow
@pytest.mark.gptq
@pytest.mark.needs_torch
def test_library_calls_print_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]), GPTQMODEL_CPU_WORKERS="2")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, env=env, timeout=1500)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-3000:]
    modules, ok, failed = (tmp_path / "result.txt").read_text().split(" ", 2)
    assert int(modules) > 0 and ok == "True", failed  # both really ran
    assert proc.stdout == b"", proc.stdout.decode(errors="replace")[-3000:]
    assert proc.stderr == b"", proc.stderr.decode(errors="replace")[-3000:]


API_SCRIPT = r"""
import sys
from pathlib import Path

import soarpack

work = Path(sys.argv[1])
tiny = soarpack.tiny_model(work / "tiny", layers=2)
result = soarpack.quantize(tiny, work / "q", recipe="w4-full", rows=8, max_len=64, device="cpu")
(work / "result.txt").write_text(f"{type(result).__name__} {result.quantized_modules}")
"""


@pytest.mark.slow
@pytest.mark.gptq
@pytest.mark.needs_torch
def test_quantize_through_the_api_prints_nothing_at_the_fd_level(tmp_path):
    from under_test import SOARPACK_ROOT

    env = dict(os.environ, PYTHONPATH=SOARPACK_ROOT, GPTQMODEL_CPU_WORKERS="2")
    out, err = tmp_path / "fd1", tmp_path / "fd2"
    with open(out, "wb") as fd1, open(err, "wb") as fd2:  # the child's fds 1 and 2 are these files
        proc = subprocess.run([sys.executable, "-c", API_SCRIPT, str(tmp_path)], stdout=fd1, stderr=fd2, env=env,
                              timeout=1500)
    assert proc.returncode == 0, err.read_text(errors="replace")[-3000:]
    kind, modules = (tmp_path / "result.txt").read_text().split()
    assert kind == "QuantizeResult" and int(modules) > 0  # it really ran
    assert out.read_bytes() == b"", out.read_text(errors="replace")[-3000:]
    assert err.read_bytes() == b"", err.read_text(errors="replace")[-3000:]


# -- fast: the rest of the API at the fd level --------------------------------------------------------------------

FAST_SCRIPT = r"""
import json, sys
from pathlib import Path

import soarpack
from soarpack.bundle.wheels import make_pure_wheel
from soarpack.serve.fake_server import ChatReply, FakeSGLang, GenerateScript
from tiny_tokenizer import make_tiny_tokenizer

work = Path(sys.argv[1])
tok = make_tiny_tokenizer(work / "tok")
data = work / "d.jsonl"
data.write_text("".join(json.dumps({"task": "qa", "question": f"q{i}", "gold": ["x"]}) + "\n" for i in range(3)))
speed = work / "s.jsonl"
speed.write_text("".join(json.dumps({"question": f"row {i} the river", "model_response": "tok tok tok"}) + "\n"
                         for i in range(3)))
make_pure_wheel(work / "wheels", "soarpack-ci-probe", "1.0", {"soarpack_ci_probe.py": "X = 1\n"})
bundle = soarpack.build(wheel_dir=work / "wheels", output=work / "b.tar.gz")
report = soarpack.check(bundle.path, rehearse=False)
with FakeSGLang(chat=lambda q: ChatReply("</think>x"), generate=GenerateScript()) as server:
    ev = soarpack.eval(api_base=server.url, data=data, output=work / "e.json", bundle=bundle.path)
    be = soarpack.bench(api_base=server.url, s1=speed, s8=speed, smax=speed, model_dir=tok, settle=0,
                        output=work / "b.json")
score = soarpack.score(ours=work / "b.json", eval=work / "e.json", best=work / "b.json")
compared = soarpack.compare([work / "e.json", work / "b.json"], chart=None)
log = work / "prepare_env.log"
log.write_text("ImportError: cannot import name 'ScalingType' from 'torch.nn.functional'\n")
found = soarpack.diagnose([log])
(work / "result.txt").write_text(" ".join(map(str, [len(report.steps), ev.total, be.tiers["s1"].completed,
                                                     round(score.final_score, 3) > 0, len(compared.runs),
                                                     len(found.findings)])))
"""


@pytest.mark.needs_torch  # without torch, importing transformers (bench's tokenizer) warns "PyTorch was not found"
def test_build_check_eval_bench_score_compare_diagnose_print_nothing_at_the_fd_level(tmp_path):
    from under_test import SOARPACK_ROOT

    tests_dir = str(Path(__file__).resolve().parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SOARPACK_ROOT, tests_dir]))
    out, err = tmp_path / "fd1", tmp_path / "fd2"
    with open(out, "wb") as fd1, open(err, "wb") as fd2:  # the child's fds 1 and 2 are these files
        proc = subprocess.run([sys.executable, "-c", FAST_SCRIPT, str(tmp_path)], stdout=fd1, stderr=fd2, env=env,
                              timeout=600)
    assert proc.returncode == 0, err.read_text(errors="replace")[-3000:]
    steps, rows, completed, scored, runs, findings = (tmp_path / "result.txt").read_text().split()
    assert int(steps) > 0 and int(rows) == 3 and int(completed) == 3 and scored == "True" and int(runs) >= 1
    assert int(findings) >= 1  # each really ran
    assert out.read_bytes() == b"", out.read_text(errors="replace")[-3000:]
    assert err.read_bytes() == b"", err.read_text(errors="replace")[-3000:]


# -- by the source: nothing outside soarpack/cli/ writes to the terminal -------------------------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "soarpack"
# Writes that are the user's explicit request, each with its reason.
ALLOWED = {
    ("quant/engine.py", "_quiet_stdout"): "GPTQModel's own prints, moved off stdout inside quant/capture's "
                                          "redirection: the run's log, or the terminal only with "
                                          "library_output='terminal' (quantize -v)",
}


def _library_files():
    return sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "cli")


def _is_std_stream(node) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr") and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def terminal_writes(source: str):
    """(function, line, what) for each write to the terminal in `source`: print() (without a file of its own),
    sys.stdout/sys.stderr written or handed on (redirect_stdout(sys.stderr), stdout=sys.stderr), a rich Console.
    A module's `main()` run under `if __name__ == "__main__"` is a command line of its own and is left out."""
    tree = ast.parse(source)
    entry_point = any(isinstance(n, ast.If) and "__main__" in ast.dump(n.test) for n in tree.body)
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name if function == "<module>" else function
        if isinstance(node, ast.Call) and not (entry_point and function == "main"):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            file = next((k.value for k in node.keywords if k.arg == "file"), None)
            if isinstance(func, ast.Name) and name == "print" and (file is None or _is_std_stream(file)):
                found.append((function, node.lineno, "print()"))
            elif name == "Console":
                found.append((function, node.lineno, "rich Console()"))
            elif isinstance(func, ast.Attribute) and _is_std_stream(func.value) and func.attr.startswith("write"):
                found.append((function, node.lineno, f"sys.{func.value.attr}.{func.attr}()"))
            elif any(_is_std_stream(a) for a in [*node.args, *(k.value for k in node.keywords)]):
                found.append((function, node.lineno, f"sys.stdout/stderr handed to {name}()"))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def test_the_source_scan_sees_each_kind_of_write():
    source = ("import sys, contextlib\nfrom rich.console import Console\n"
              "def a():\n    print('x')\ndef b():\n    sys.stderr.write('x')\ndef c():\n    Console().print('x')\n"
              "def d():\n    return contextlib.redirect_stdout(sys.stderr)\n"
              "def e(fh):\n    print('x', file=fh)\n"  # a file of its own: not the terminal
              "def main():\n    print('x')\n")  # no __main__ block: an ordinary function
    assert [(f, what) for f, _, what in terminal_writes(source)] == [
        ("a", "print()"), ("b", "sys.stderr.write()"), ("c", "rich Console()"),
        ("d", "sys.stdout/stderr handed to redirect_stdout()"), ("main", "print()")]
    assert terminal_writes(source.replace("def main():", "if __name__ == '__main__':\n    main()\ndef main():")
                           )[-1][0] != "main"


@pytest.mark.parametrize("module", _library_files())
def test_no_library_function_writes_to_the_terminal(module):
    writes = [(f, line, what) for f, line, what in terminal_writes((PACKAGE / module).read_text(encoding="utf-8"))
              if (module, f) not in ALLOWED]
    assert writes == [], f"{module}: " + "; ".join(f"{f}() line {line}: {what}" for f, line, what in writes)


def test_every_allowed_write_still_exists():
    for module, function in ALLOWED:
        assert function in {f for f, _, _ in terminal_writes((PACKAGE / module).read_text(encoding="utf-8"))}
