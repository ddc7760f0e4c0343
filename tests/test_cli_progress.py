"""Slow steps say what they do: check announces each step as it starts, bench and quantize print plain progress
lines when stderr is not a terminal (a log file, CI), and a Ctrl-C says what was (and was not) written.
The quantize runs themselves (a tiny model in a child process) are in test_quant_quiet.py."""

import json

import pytest

from typer.testing import CliRunner

import soarpack.cli.bench as cli_bench
from soarpack.serve.fake_server import FakeSGLang, GenerateScript
from tiny_tokenizer import make_tiny_tokenizer
from soarpack.bundle.build import build_bundle
from soarpack.cli import app


def test_check_announces_each_step_before_its_result(tmp_path):
    bundle = build_bundle(tmp_path / "b.tar.gz", wheels=False, calib_rows=8).path
    result = CliRunner().invoke(app, ["check", str(bundle), "--no-rehearse"])
    lines = result.output.splitlines()
    for step in ("size", "extract", "structure", "args lint"):
        started = lines.index(f"running: {step} ...")
        assert lines[started + 1].split()[1:1 + len(step.split())] == step.split(), lines[started:started + 2]


def test_bench_prints_plain_progress_lines_off_a_terminal(tmp_path, monkeypatch):
    monkeypatch.setattr(cli_bench, "PLAIN_PROGRESS_EVERY_S", 0.0)
    tokenizer = make_tiny_tokenizer(tmp_path / "model")
    data = tmp_path / "s.jsonl"
    data.write_text("".join(json.dumps({"question": f"row {i} the river", "model_response": "tok tok tok"}) + "\n"
                            for i in range(3)))
    with FakeSGLang(generate=GenerateScript(ttft_s=0.0, token_delay_s=0.0)) as server:
        result = CliRunner().invoke(app, ["bench", "--api-base", server.url, "--s1", str(data), "--model-dir",
                                          str(tokenizer), "-o", str(tmp_path / "b.json"), "--settle", "0"])
    assert result.exit_code == 0, result.output
    progress = [line for line in result.output.splitlines() if line.startswith("bench s1: ")]
    assert [p.split()[2] for p in progress] == ["1/3", "2/3", "3/3"]


# -- quantize's progress off a terminal, and Ctrl-C ---------------------------------------------------------------


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _quantize_progress(clock, verbosity=1):
    from soarpack.cli.progress import QuantizeProgress

    return QuantizeProgress(verbosity=verbosity, clock=clock)  # render() without `with`: no watcher thread


def test_quantize_plain_lines_rate_limit_gptq_layers(capsys):
    from soarpack.cli.progress import PLAIN_LAYER_EVERY_S
    from soarpack.steps import Event

    clock = _Clock()
    progress = _quantize_progress(clock)
    assert progress.plain  # pytest's captured stderr is no terminal
    progress.render(Event("start", "gptq"))
    for i in range(4):  # four layers inside one rate-limit window: only the first is a line
        progress.render(Event("progress", "gptq", f"gptq layer {i + 1}/8 started", done=i, total=8))
        clock.now += PLAIN_LAYER_EVERY_S / 8
    clock.now += PLAIN_LAYER_EVERY_S
    progress.render(Event("progress", "gptq", "gptq layer 5/8 started", done=4, total=8))
    progress.render(Event("end", "gptq", seconds=12.5))
    assert capsys.readouterr().err.splitlines() == [
        "quantize: gptq ...", "quantize: gptq layer 1/8 started", "quantize: gptq layer 5/8 started",
        "quantize: gptq done in 12.5 s"]


def test_quantize_plain_lines_say_a_silent_phase_is_still_running(capsys):
    from soarpack.cli.progress import PLAIN_SILENCE_MAX_S
    from soarpack.steps import Event

    clock = _Clock()
    progress = _quantize_progress(clock)
    progress.render(Event("start", "load"))
    progress.tick()  # just started: nothing to say
    clock.now += PLAIN_SILENCE_MAX_S
    progress.tick()
    progress.tick()  # the line it just said resets the silence
    progress.render(Event("end", "load", seconds=PLAIN_SILENCE_MAX_S))
    clock.now += 10 * PLAIN_SILENCE_MAX_S
    progress.tick()  # between phases: the next phase's start is the next line
    assert capsys.readouterr().err.splitlines() == [
        "quantize: load ...", f"quantize: load: still running, {PLAIN_SILENCE_MAX_S:.0f} s after the start",
        f"quantize: load done in {PLAIN_SILENCE_MAX_S:.1f} s"]


def test_quantize_plain_lines_never_call_an_interrupted_phase_done(capsys):
    from soarpack.steps import Event

    progress = _quantize_progress(_Clock())
    progress.render(Event("start", "gptq"))
    progress.render(Event("progress", "gptq", "gptq layer 3/8 started", done=2, total=8))
    progress.render(Event("end", "gptq", "interrupted", seconds=26.0))
    assert capsys.readouterr().err.splitlines()[-1] == "quantize: gptq interrupted after 26.0 s"
    assert progress.where() == "in gptq at layer 3/8"


def test_quantize_quiet_prints_only_problems(capsys):
    from soarpack.steps import Event

    clock = _Clock()
    progress = _quantize_progress(clock, verbosity=0)
    progress.render(Event("start", "gptq"))
    progress.render(Event("progress", "gptq", "gptq layer 1/8 started", done=0, total=8))
    progress.render(Event("problem", "gptq", "fell back to torch"))
    clock.now += 1000
    progress.tick()
    progress.render(Event("end", "gptq", seconds=1.0))
    assert capsys.readouterr().err.splitlines() == ["note: fell back to torch"]


# -- bench's Ctrl-C names only what it wrote ----------------------------------------------------------------------


def _interrupted_bench(tmp_path, monkeypatch, finish_tiers: int, *flags: str):
    """A bench of s1 and s8 against the stand-in server, Ctrl-C'd after `finish_tiers` tiers finished."""
    import soarpack.measure.speed as speed

    real_run_tier, finished = speed.run_tier, []

    async def run_tier(*args, **kwargs):
        if len(finished) == finish_tiers:
            raise KeyboardInterrupt
        finished.append(await real_run_tier(*args, **kwargs))
        return finished[-1]

    monkeypatch.setattr(speed, "run_tier", run_tier)
    tokenizer = make_tiny_tokenizer(tmp_path / "model")
    data = tmp_path / "s.jsonl"
    data.write_text("".join(json.dumps({"question": f"row {i} the river", "model_response": "tok tok tok"}) + "\n"
                            for i in range(3)))
    with FakeSGLang(generate=GenerateScript(ttft_s=0.0, token_delay_s=0.0)) as server:
        return CliRunner().invoke(app, [*flags, "bench", "--api-base", server.url, "--s1", str(data), "--s8", str(data),
                                        "--model-dir", str(tokenizer), "-o", str(tmp_path / "b.json"),
                                        "--settle", "0"])


@pytest.mark.parametrize("flags", [[], ["-q"]], ids=["normal", "quiet"])
def test_bench_ctrl_c_before_any_tier_says_no_partial_was_written(tmp_path, monkeypatch, flags):
    result = _interrupted_bench(tmp_path, monkeypatch, 0, *flags)  # -q too: what is on disk is never hidden
    assert result.exit_code == 130, result.output
    assert not (tmp_path / "b.partial.json").exists()
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("interrupted: ") and "no partial results were written" in line, line
    assert "finished tiers are in" not in line


def test_bench_ctrl_c_names_the_partial_it_wrote_and_its_rows(tmp_path, monkeypatch):
    result = _interrupted_bench(tmp_path, monkeypatch, finish_tiers=1)
    assert result.exit_code == 130, result.output
    partial = tmp_path / "b.partial.json"
    assert set(json.loads(partial.read_text())["tiers"]) == {"s1"}
    assert f"the finished tiers are in {partial}: 1 tier(s), s1 3 rows" in result.output


def test_bench_ctrl_c_does_not_pass_off_an_earlier_partial_as_this_runs(tmp_path, monkeypatch):
    partial = tmp_path / "b.partial.json"
    partial.write_text(json.dumps({"tiers": {"s1": {"num_requests": 9}}}))
    result = _interrupted_bench(tmp_path, monkeypatch, finish_tiers=0)
    assert result.exit_code == 130, result.output
    assert f"{partial} is an earlier run's, left as it was" in result.output
    assert json.loads(partial.read_text())["tiers"]["s1"]["num_requests"] == 9


def test_quantize_progress_outlives_a_closed_pipe(monkeypatch):
    """`soarpack quantize ... 2>&1 | head`: once the reader is gone, the run goes on without its lines."""
    from soarpack.steps import Event

    class ClosedPipe:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

        def isatty(self):
            return False

    monkeypatch.setattr("sys.stderr", ClosedPipe())
    progress = _quantize_progress(_Clock())
    for event in (Event("start", "gptq"), Event("problem", "gptq", "a note"), Event("end", "gptq", seconds=1.0)):
        progress.render(event)
    progress.__exit__(None, None, None)


def test_the_sink_never_shows_an_interrupted_phase_as_finished(capsys):
    from soarpack.cli.output import VERBOSE, Sink
    from soarpack.steps import Event

    sink = Sink(verbosity=VERBOSE)
    sink.event(Event("end", "gptq", seconds=2.0))
    sink.event(Event("end", "gptq", "interrupted", seconds=2.0))
    assert capsys.readouterr().err.splitlines() == ["gptq 2.0s", "gptq interrupted after 2.0s"]
