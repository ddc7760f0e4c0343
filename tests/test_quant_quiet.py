"""`soarpack quantize` on a terminal shows the bar and the summary only: the libraries' output (GPTQModel's banner,
bars and tables, torchao and torch warnings) goes to the log file, whose path is printed with the report's."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.sala.tiny import make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.gptq]
ARGS = ["--recipe", "w4-full", "--rows", "8", "--max-len", "64", "--device", "cpu"]
LIBRARY_NOISE = ("GPT-QModel", "INFO", "WARN", "Failed to load", "pytree", "FutureWarning")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("quiet") / "tiny", num_layers=2)


def _summary_only(text: str, out: Path) -> None:
    for noise in LIBRARY_NOISE:
        assert noise not in text, f"{noise!r} reached the terminal:\n{text}"
    assert "total" in text and "KL mean / max" in text
    assert f"report: {out / 'soarpack_quant_report.json'}" in text
    log = out.with_name(out.name + ".log")
    text = text.replace("\r\n", "\n")  # a terminal's line ends
    said = re.search(rf"^(\d+) library warnings?: {re.escape(str(log))}$", text, re.M)
    assert said, text  # the one line in place of the warnings: how many, and where they are
    assert int(said.group(1)) == len(_warning_lines(log)) > 0
    assert f"log: {log}" not in text


def _warning_lines(log: Path):
    """The libraries' warning lines in a quantize log, by their known shapes (not soarpack's own timestamped lines)."""
    shapes = re.compile(r"Failed to load \S|[WE]\d{4} \d\d:\d\d:\d\d\.\d+ |\w+Warning: |(?:^|\s)WARN ")
    return [ln for ln in log.read_text(errors="replace").splitlines()
            if shapes.search(ln) and not re.match(r"\d{4}-\d\d-\d\d ", ln)]


def test_cli_output_is_the_summary_and_the_report_is_complete(tiny, tmp_path):
    out = tmp_path / "q"
    res = CliRunner().invoke(app, ["quantize", str(tiny), str(out), *ARGS])
    assert res.exit_code == 0, res.output
    _summary_only(res.output, out)
    assert "gptq layer 1/2" in out.with_name("q.log").read_text()  # our own lines go there too
    report = json.loads((out / "soarpack_quant_report.json").read_text())
    assert report["modules"]["model.layers.0.mlp.down_proj"] == "4-bit g128"
    assert report["settings"]["calibration"]["rows"] == 8 and report["versions"]["gptqmodel"] == "7.6.0"


def test_verbose_and_quiet_exclude_each_other(tiny, tmp_path):
    res = CliRunner().invoke(app, ["quantize", str(tiny), str(tmp_path / "x"), "-q", "-v"])
    assert res.exit_code == 2 and "exclude each other" in res.output


def test_a_terminal_sees_no_library_output(tiny, tmp_path):
    out = tmp_path / "tty"
    main, child = pty.openpty()
    env = dict(os.environ, COLUMNS="100", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "soarpack", "quantize", str(tiny), str(out), *ARGS],
                            stdin=child, stdout=child, stderr=child, env=env, close_fds=True)
    os.close(child)
    chunks, deadline = [], time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            data = os.read(main, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 0
    os.close(main)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))
    _summary_only(text, out)
    assert "GPT-QModel" in out.with_name("tty.log").read_text()  # a fresh process: GPTQModel's import banner


def _tree_under_test() -> str:
    """The checkout whose soarpack these tests imported (a subprocess runs the same one)."""
    import soarpack

    return str(Path(soarpack.__file__).resolve().parents[1])


# What the quick start showed after a successful run (issue 27 item 3), each by its source.
ALARMING = {
    "torchao's logger.warning on its CUDA-only extensions": re.compile(r"Failed to load .*torchao/_C"),
    "torch's pytree W lines (glog format)": re.compile(r"^W\d{4} .*_pytree\.py", re.M),
    "GPTQModel's GIL warning": re.compile(r"Python GIL is enabled"),
    "GPTQModel's import banner": re.compile(r"GPT-QModel\s+(│|:)"),
}


def test_a_cli_quantize_in_a_subprocess_counts_the_library_warnings_and_keeps_them_in_its_log(tiny, tmp_path):
    """Pipes, not a terminal: stderr holds none of the libraries' lines, stdout names their count and the log,
    and the log holds them (GIL warning: switched off at the source with GPTQModel's own variable)."""
    out = tmp_path / "sub"
    env = dict(os.environ, PYTHONPATH=_tree_under_test(), GPTQMODEL_CPU_WORKERS="2")
    env.pop("GPTQMODEL_DISABLE_GIL_WARNING", None)
    proc = subprocess.run([sys.executable, "-m", "soarpack", "quantize", str(tiny), str(out), *ARGS],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for what, shape in ALARMING.items():
        assert not shape.search(proc.stderr) and not shape.search(proc.stdout), (what, proc.stderr, proc.stdout)
    assert "WARN" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    log = out.with_name("sub.log")
    text = log.read_text(errors="replace")
    for what in ("torchao's logger.warning on its CUDA-only extensions", "torch's pytree W lines (glog format)",
                 "GPTQModel's import banner"):
        assert ALARMING[what].search(text), what
    assert not ALARMING["GPTQModel's GIL warning"].search(text)
    n = len(_warning_lines(log))
    assert n >= 4 and f"{n} library warnings: {log}" in proc.stdout.splitlines(), proc.stdout


def test_install_ends_with_the_versions_and_the_count_not_the_libraries_lines(tmp_path):
    """scripts/install.sh's last step (scripts/import_check.py): the import-time lines go to its log."""
    root = Path(__file__).resolve().parents[1]
    log = tmp_path / "import-check.log"
    env = dict(os.environ, PYTHONPATH=_tree_under_test())
    env.pop("GPTQMODEL_DISABLE_GIL_WARNING", None)
    proc = subprocess.run([sys.executable, str(root / "scripts" / "import_check.py"), str(log)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("soarpack ") and " gptqmodel 7.6.0" in lines[0], lines
    n = len(_warning_lines(log))
    assert n >= 4 and lines[1] == f"{n} library warnings: {log}"
    text = log.read_text(errors="replace")
    assert ALARMING["GPTQModel's import banner"].search(text) and ALARMING["torch's pytree W lines (glog format)"].search(text)
    assert "install.sh" in (root / "scripts" / "import_check.py").read_text()
    assert "scripts/import_check.py" in (root / "scripts" / "install.sh").read_text()
