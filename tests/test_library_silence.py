"""Libraries emit, the CLI renders: a tiny-model quantize and a development-stack `check`, called from Python in a
fresh interpreter, write nothing to file descriptors 1 and 2 (not even the libraries' banners); the same through
the package-root API (`soarpack.quantize(...)`), with fds 1 and 2 redirected to files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.gptq, pytest.mark.needs_torch]

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
