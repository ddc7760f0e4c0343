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
from soarpack.quant.capture import count_library_warnings
from soarpack.sala.tiny import make_tiny_model
from under_test import SOARPACK_ROOT

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
    """The libraries' warning lines in a quantize log. Which shapes count is soarpack.quant.capture's one rule, each
    shape pinned by tests/test_library_warnings.py; here what matters is that the terminal's count is this log's.
    (A copy of the rule here once missed GPTQModel's `WARN` redrawn after a bar's `%`: CI's disk was slow enough
    for its IO warning to land there, and the count said 3 where the copy found 2.)"""
    with open(log, encoding="utf-8", errors="replace", newline="\n") as fh:  # a bar's \r redraws stay in their line
        return [ln for ln in fh if count_library_warnings([ln])]


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
    env = dict(os.environ, PYTHONPATH=SOARPACK_ROOT, GPTQMODEL_CPU_WORKERS="2")
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
    env = dict(os.environ, PYTHONPATH=SOARPACK_ROOT)
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


# -- off a terminal: plain progress lines; Ctrl-C; no stray logs ---------------------------------------------------

PHASES = ("check", "calibration", "load", "sanity", "gptq", "save", "quality", "verify")


def _child_env() -> dict:
    """The environment of a child `python -m soarpack`: it imports the soarpack this test imported."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SOARPACK_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))


def _quantize_piped(*argv: str) -> subprocess.CompletedProcess:
    """`soarpack ...` with stdout and stderr as pipes, as under nohup, CI or the platform's tee."""
    return subprocess.run([sys.executable, "-m", "soarpack", *argv], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, env=_child_env(), timeout=900)


def test_off_a_terminal_each_phase_is_a_line_and_json_stays_pure(tiny, tmp_path):
    out = tmp_path / "piped"
    proc = _quantize_piped("--format", "json", "quantize", str(tiny), str(out), *ARGS)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["recipe"] == "w4-full"  # stdout: the JSON and nothing else
    lines = proc.stderr.splitlines()
    assert "\x1b" not in proc.stderr and "\r" not in proc.stderr, proc.stderr  # lines, not a live display
    for noise in LIBRARY_NOISE:
        assert noise not in proc.stderr, proc.stderr
    said = [line for line in lines if line.startswith("quantize: ")]
    ends = [re.sub(r" done in [0-9.]+ s$", " done", s) for s in said if s.endswith(" ...") or " done in " in s]
    assert ends == [f"quantize: {p} {e}" for p in PHASES for e in ("...", "done")], said  # in the run's order
    gptq_done = next(s for s in said if s.startswith("quantize: gptq done"))
    gptq = said[said.index("quantize: gptq ..."):said.index(gptq_done)]
    assert any(s.startswith("quantize: gptq layer 1/2 started after ") for s in gptq), said


def test_off_a_terminal_quiet_says_nothing_but_the_result(tiny, tmp_path):
    out = tmp_path / "quiet"
    proc = _quantize_piped("quantize", str(tiny), str(out), *ARGS, "-q")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert f"report: {out / 'soarpack_quant_report.json'}" in proc.stdout


STOP_IN_GPTQ = '''
import signal, sys, time
from pathlib import Path
import soarpack.quant.engine as engine

# Ctrl-C as a terminal delivers it, even where this test runs with SIGINT ignored (nohup, `&`): Python's own default
signal.signal(signal.SIGINT, signal.default_int_handler)

real = engine.run_gptq


def run_gptq(sala, model_dir, rows, recipe, opts, on_layer=None):
    def on_first_layer_wait(i, n):  # the test's Ctrl-C comes here; at most 10 minutes, then the run goes on
        on_layer(i, n)
        if i == 0:
            Path(sys.argv[1]).write_text("held")
        t0 = time.monotonic()
        while i == 0 and time.monotonic() - t0 < 600:
            time.sleep(0.05)
    return real(sala, model_dir, rows, recipe, opts, on_first_layer_wait)


engine.run_gptq = run_gptq
from soarpack.cli import main
main(sys.argv[2:])
'''


def _wait_for(condition, proc, limit_s: float = 600) -> bool:
    """Poll until `condition()` or the child ended: a generous bound for a loaded machine, not a timing check."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if condition():
            return True
        if proc.poll() is not None:
            return condition()
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("existing", [False, True], ids=["new-out", "forced-over-out"])
def test_ctrl_c_in_gptq_says_where_it_stopped_and_what_became_of_out(tiny, tmp_path, existing):
    import signal
    import threading

    driver, held = tmp_path / "stop_in_gptq.py", tmp_path / "held"
    driver.write_text(STOP_IN_GPTQ)
    out = tmp_path / "q-mid"
    log = tmp_path / "q-mid.log"
    if existing:
        out.mkdir()
        (out / "config.json").write_text('{"an": "earlier good output"}')
    proc = subprocess.Popen([sys.executable, str(driver), str(held), "quantize", str(tiny), str(out), *ARGS,
                             *(["--force"] if existing else [])],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_child_env())
    seen: list = []
    stdout: list = []
    readers = [threading.Thread(target=lambda: seen.extend(line.rstrip("\n") for line in proc.stderr), daemon=True),
               threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        assert _wait_for(held.exists, proc), "the run never reached its first GPTQ layer:\n" + "\n".join(seen)
        # the layer's line was said before the hold: it reaches the pipe while the run is still in gptq
        layer_line = lambda: any(s.startswith("quantize: gptq layer 1/2 started") for s in seen)  # noqa: E731
        said_while_held = _wait_for(layer_line, proc, 60)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=600) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    for reader in readers:
        reader.join(timeout=60)
    text = "\n".join(seen)
    assert said_while_held, text
    assert "quantize: gptq interrupted after " in text and "quantize: gptq done" not in text, text
    assert stdout == [""]  # no result: nothing on stdout
    assert "interrupted in gptq at layer 1/2, " in text, text
    if existing:
        assert f"{out} was left as it was" in text, text
        assert os.listdir(out) == ["config.json"] and "earlier good output" in (out / "config.json").read_text()
    else:
        assert f"nothing was written to {out}" in text and not out.exists(), text
    assert seen[-1] == f"log: {log}", text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".q-mid")]  # no temp folder, no lock
    ours = [line for line in log.read_text().splitlines() if line[:4].isdigit()]
    assert " gptq interrupted after " in ours[-2], ours[-3:]
    assert " run interrupted (Ctrl-C) in gptq at layer 1/2, " in ours[-1], ours[-3:]
    assert log.read_text().endswith(ours[-1] + "\n")  # the log's last line says how the run ended


@pytest.mark.parametrize("case", ["recipe", "model", "existing-out"])
def test_a_run_refused_before_its_work_leaves_no_log(tiny, tmp_path, case):
    out = tmp_path / "out"
    model = str(tmp_path / "nosuch") if case == "model" else str(tiny)
    recipe = "w4-ful" if case == "recipe" else "w4-full"
    if case == "existing-out":
        out.mkdir()
        (out / "keep").write_text("mine")
    res = CliRunner().invoke(app, ["quantize", model, str(out), *ARGS, "--recipe", recipe])
    assert res.exit_code == 2 and "error:" in res.output, res.output
    assert not (tmp_path / "out.log").exists()
    assert "log:" not in res.output  # none to show
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if case == "existing-out" else [])


def test_a_refused_run_keeps_a_log_it_did_not_create(tiny, tmp_path):
    log = tmp_path / "mine.log"
    log.write_text("earlier runs\n")
    res = CliRunner().invoke(app, ["quantize", str(tiny), str(tmp_path / "out"), *ARGS, "--recipe", "w4-ful",
                                   "--log", str(log)])
    assert res.exit_code == 2, res.output
    text = log.read_text()
    assert text.startswith("earlier runs\n") and "run failed in check" in text.splitlines()[-1], text


def test_a_run_failed_in_its_work_keeps_its_log_and_says_where(tiny, tmp_path):
    out = tmp_path / "out"
    log = tmp_path / "out.log"
    res = CliRunner().invoke(app, ["quantize", str(tiny), str(out), *ARGS, "--max-sanity-loss", "0.1"])
    assert res.exit_code == 2 and "exceeds the sanity bound" in res.output, res.output
    assert f"log: {log}" in res.output and "quantize: sanity failed after " in res.output
    last = log.read_text().splitlines()[-1]
    assert " run failed in sanity, " in last and "exceeds the sanity bound" in last, last
    assert not out.exists()


def test_the_library_removes_only_a_log_it_created_for_a_refused_run(tiny, tmp_path):
    from soarpack.errors import ConfigError
    from soarpack.quant.options import QuantizeOptions
    from soarpack.quant.run import quantize

    log = tmp_path / "run.log"
    with pytest.raises(ConfigError, match="no recipe named"):
        quantize(tiny, tmp_path / "out", QuantizeOptions(recipe="w4-ful", log_file=log))
    assert not log.exists()
