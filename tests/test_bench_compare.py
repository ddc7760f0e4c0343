"""`soarpack compare`: runs side by side from real eval and bench results, the gate's exit code, the chart."""

import json
import struct

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import ChatReply, FakeSGLang
from soarpack.measure.evaluate import EvalConfig, run_eval
from soarpack.cli import app
from soarpack.facts import engine


def _eval(tmp_path, label, answer, n=10, right=None):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task": "niah" if i % 2 else "qa", "question": f"q{i}", "gold": ["x"]}) + "\n"
                            for i in range(n)))
    out = tmp_path / f"eval-{label}.json"
    right = n if right is None else right
    with FakeSGLang(chat=lambda q: ChatReply(answer if int(q[1:]) < right else "</think>no")) as server:
        run_eval(EvalConfig(api_base=server.url, data=data, output=out, label=label))
    return out


def _bench(tmp_path, label, durations):
    """A bench result as `soarpack bench` writes it (the tier fields compare reads)."""
    out = tmp_path / f"bench-{label}.json"
    tiers = {t: {"failed": 0, "short_outputs": 0, "duration_s": d} for t, d in durations.items()}
    out.write_text(json.dumps({"kind": "soarpack.bench", "version": 2, "measured": {"label": label}, "tiers": tiers}))
    return out


def test_compare_table_formats_and_gate_exit(tmp_path):
    good = [_eval(tmp_path, "good", "</think>x"), _bench(tmp_path, "good", {"s1": 10.0, "s8": 20.0, "smax": 30.0})]
    # 7 of 10 right: ori 70, overall 87.5 → C 0
    weak = [_eval(tmp_path, "weak", "</think>x", right=7), _bench(tmp_path, "weak", {"s1": 5.0, "s8": 20.0, "smax": 60.0})]
    runner = CliRunner()
    only_good = runner.invoke(app, ["compare", *map(str, good)])
    assert only_good.exit_code == 0, only_good.output
    assert only_good.stdout.splitlines()[1].split() == ["good", "100.00", "+20.80", "100.00-100.00", "100.00", "1", "100.00", "100.00", "100.00", "100.00", "pass"]

    both = runner.invoke(app, ["compare", *map(str, good + weak), "--table", "csv"])
    assert both.exit_code == 1 and "below the accuracy gate" in both.output and "weak" in both.output
    rows = [line.split(",") for line in both.stdout.strip().splitlines()]
    assert rows[0] == ["run", "ori", "margin", "ci95", "accuracy", "C", "S1", "S8", "Smax", "final", "gate"]
    # S = 100 × best / ours, best the fastest run per tier: good's S1 is 100 × 5 / 10
    assert rows[1][4:10] == ["100.00", "1", "50.00", "100.00", "100.00", "80.00"] and rows[1][0] == "good"
    assert rows[2][0] == "weak" and rows[2][1:3] == ["70.00", "-9.20"]
    assert rows[2][4:] == ["87.50", "0", "100.00", "100.00", "50.00", "0.00", "below"]

    as_json = json.loads(runner.invoke(app, ["--format", "json", "compare", *map(str, good + weak)]).stdout)
    assert as_json["best_s"] == {"s1": 5.0, "s8": 20.0, "smax": 30.0}
    assert [r["below_gate"] for r in as_json["runs"]] == [False, True]
    assert json.loads(runner.invoke(app, ["compare", *map(str, good + weak), "--json"]).stdout) == as_json
    md = runner.invoke(app, ["compare", *map(str, good), "--table", "md"]).stdout.splitlines()
    assert md[0].startswith("| run") and set(md[1]) <= {"|", "-"}
    bad = runner.invoke(app, ["compare", str(good[0]), "--table", "yaml"])
    assert bad.exit_code == 2 and "yaml" in bad.output


def test_compare_old_format_flag_still_works_and_says_its_new_name(tmp_path):
    good = [_eval(tmp_path, "good", "</think>x"), _bench(tmp_path, "good", {"s1": 10.0, "s8": 20.0, "smax": 30.0})]
    runner = CliRunner()
    old = runner.invoke(app, ["compare", *map(str, good), "--format", "md"])
    assert old.exit_code == 0 and old.stdout == runner.invoke(app, ["compare", *map(str, good), "--table", "md"]).stdout
    assert "is now --table md" in old.stderr
    old_json = runner.invoke(app, ["compare", *map(str, good), "--format", "json"])
    assert json.loads(old_json.stdout)["runs"][0]["below_gate"] is False and "is now --json" in old_json.stderr


def test_compare_chart_is_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="not run: the plot extra (matplotlib) is not installed")
    files = [_eval(tmp_path, "a", "</think>x"), _bench(tmp_path, "a", {"s1": 10.0, "s8": 20.0, "smax": 30.0}),
             _eval(tmp_path, "b", "</think>x", right=7), _bench(tmp_path, "b", {"s1": 9.0, "s8": 25.0, "smax": 28.0})]
    png = tmp_path / "runs.png"
    result = CliRunner().invoke(app, ["compare", *map(str, files), "--chart", str(png)])
    assert result.exit_code == 1  # b is below the gate; the chart is still written
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 450) and 20_000 < len(data) < 2_000_000


def test_chart_without_matplotlib_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib raises ImportError
    files = [_bench(tmp_path, "a", {"s1": 10.0, "s8": 20.0, "smax": 30.0})]
    result = CliRunner().invoke(app, ["compare", *map(str, files), "--chart", str(tmp_path / "c.png")])
    assert result.exit_code == 2 and "needs matplotlib" in result.output
    # the extra's install pins torch as the dev install does: unpinned, pip would pull a CUDA torch
    hint = " ".join(result.output.split())
    assert f'pip install "{engine.DEV_TORCH_SPEC}" -e ".[plot]"' in hint and '"soarpack[plot]"' not in hint
    assert "Traceback" not in result.output and not (tmp_path / "c.png").exists()
