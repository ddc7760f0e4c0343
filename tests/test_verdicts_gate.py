"""The gate where decisions are made: eval and compare show ori, its margin to 79.2 and a 95 % interval stratified
by task; compare marks a run `at risk` when the interval reaches 79.2 and exits 1 only for ori <= 79.2."""

import json

import pytest
from typer.testing import CliRunner

from soarpack.serve.fake_server import ChatReply, FakeSGLang
from soarpack.measure.compare import load_runs
from soarpack.measure.evaluate import EvalConfig, run_eval
from soarpack.measure.scoring import full_credit_ori, gate_line, gate_of_records, gate_of_total, ori_interval
from soarpack.cli import app

TASKS = ("mcq", "niah", "qa", "fwe", "cwe")


def _public_like(tmp_path, right_per_task):
    """150 rows, 30 per public task; the first `right_per_task` rows of each task are answered right."""
    data = tmp_path / "public.jsonl"
    rows = [{"task": t, "question": f"{t} {i}", "gold": "A" if t == "mcq" else ["needle"]} for t in TASKS for i in range(30)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def reply(q):
        i = int(q.split()[1])
        return ChatReply("</think>needle\nANSWER: A" if i < right_per_task else "</think>no")

    return data, reply


def _eval_file(tmp_path, label, right_per_task):
    data, reply = _public_like(tmp_path, right_per_task)
    out = tmp_path / f"eval-{label}.json"
    with FakeSGLang(chat=reply) as server:
        report = run_eval(EvalConfig(api_base=server.url, data=data, output=out, label=label))
    return out, report


def test_full_credit_line_and_interval_math():
    assert full_credit_ori() == 79.2
    # one task, 0/1 scores, p = 0.8 on 150 rows: half width 1.96 * sqrt(.8 * .2 / 149 * 150 / 150) in points
    low, high = ori_interval({"qa": [1.0] * 120 + [0.0] * 30})
    assert low == pytest.approx(73.58, abs=0.02) and high == pytest.approx(86.42, abs=0.02)
    # strata that all agree add no width; a one-row stratum counts with the largest variance (0.25)
    assert ori_interval({"a": [1.0] * 10, "b": [0.0] * 10}) == (50.0, 50.0)
    assert ori_interval({"a": [1.0]}) == (2.0, 100.0)
    assert gate_of_total(80.0, 100).verdict == "at risk" and gate_of_total(79.2, 100).verdict == "below"
    assert "95% interval" in gate_line(80.0, 100) and "margin +0.80 points" in gate_line(80.0, 100)


def test_compare_marks_ori_80_on_150_rows_at_risk_and_96_67_pass(tmp_path):
    flaky, flaky_report = _eval_file(tmp_path, "flaky", 24)  # 24 of 30 per task: ori 80.00
    good, good_report = _eval_file(tmp_path, "good", 29)  # 29 of 30 per task: ori 96.67
    assert (flaky_report["ori_accuracy"], good_report["ori_accuracy"]) == (80.0, 96.67)
    assert flaky_report["overall_accuracy"] == good_report["overall_accuracy"] == 100.0  # the cap hides the gap
    runs = {r.name: r for r in load_runs([flaky, good])}
    assert runs["flaky"].gate.stratified and runs["flaky"].gate.rows == 150
    assert runs["flaky"].gate.low <= 79.2 < runs["good"].gate.low
    assert runs["flaky"].at_risk and not runs["good"].at_risk

    result = CliRunner().invoke(app, ["compare", str(flaky), str(good)])
    assert result.exit_code == 0, result.output  # ori 80.0 > 79.2: at risk, not below
    table = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert table["flaky"][1:3] == ["80.00", "+0.80"] and table["flaky"][-2:] == ["at", "risk"]
    assert result.stdout.splitlines()[1].endswith("at risk") and result.stdout.splitlines()[2].endswith("pass")
    assert table["good"][1:3] == ["96.67", "+17.47"]
    assert "at risk: flaky: ori 80.00, margin +0.80 points to the 79.2 full-credit line, 95% interval" in result.output

    as_json = json.loads(CliRunner().invoke(app, ["compare", str(flaky), str(good), "--format", "json"]).stdout)
    assert [(r["name"], r["at_risk"], r["gate"]["verdict"]) for r in as_json["runs"]] == [
        ("flaky", True, "at risk"), ("good", False, "pass")]


def test_compare_still_exits_1_for_a_point_estimate_at_the_line(tmp_path):
    at_line, report = _eval_file(tmp_path, "line", 23)  # 23 of 30: ori 76.67
    assert report["ori_accuracy"] <= 79.2
    result = CliRunner().invoke(app, ["compare", str(at_line)])
    assert result.exit_code == 1 and result.stdout.splitlines()[1].endswith("below")


def test_eval_prints_the_margin_and_interval(tmp_path):
    data, reply = _public_like(tmp_path, 24)
    with FakeSGLang(chat=reply) as server:
        result = CliRunner().invoke(app, ["eval", "--api-base", server.url, "--data", str(data),
                                          "-o", str(tmp_path / "e.json")])
        as_json = CliRunner().invoke(app, ["eval", "--api-base", server.url, "--data", str(data),
                                           "-o", str(tmp_path / "e.json"), "--json"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "gate: ori 80.00, margin +0.80 points to the 79.2 full-credit line, 95% interval" in text
    assert "(stratified by task, 150 rows): C = 1, at risk" in text
    gate = json.loads(as_json.stdout)["gate"]
    assert gate["margin"] == 0.8 and gate["verdict"] == "at risk" and gate["ci95"][0] <= 79.2


def test_gate_of_records_counts_fractional_scores_by_task():
    gate = gate_of_records([{"task": "cwe", "score": 0.5}, {"task": "cwe", "score": 1.0}, {"task": "mcq", "score": 1.0}])
    assert gate.ori == 83.33 and gate.rows == 3 and gate.stratified and gate.low < gate.ori < gate.high
