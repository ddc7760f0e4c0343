"""Issue 39, part B: score and compare, the MANIFEST, serve lint. Each test is a case the sweep of 9ef8388 found:
a best time slower than ours, a subnormal duration, a NaN or non-numeric accuracy, eval and bench of different
servers joined under one label, a MANIFEST format of 1.0 or true, NaN or negative calibration counts, extra_args
contradicting the calibration record, deep-nested JSON, and a profile's --port."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from soarpack.measure.compare import load_runs, render, score_runs
from soarpack.measure.competition import final_score
from soarpack.measure.evaluate import EvalConfig, run_eval
from soarpack.measure.scoring import c_factor
from soarpack.bundle import layout
from soarpack.bundle.build import build_bundle
from soarpack.bundle.manifest import MANIFEST_NAME, consistency_problems, parse_manifest
from soarpack.bundle.summary import inspect_bundle
from soarpack.bundle.tarpack import safe_extract, write_tarball
from cli_results import one_error_line, run_cli
from soarpack.errors import ConfigError, InputDataError, SoarpackError
from soarpack.rehearse.check import check_bundle
from soarpack.serve.fake_server import ChatReply, FakeSGLang
from soarpack.serve.lint import ERROR_RULES, lint_args

DEEP = "[" * 100_000 + "]" * 100_000  # the sweep's 100,000 levels




def bench_json(path, durations, **top):
    tiers = {t: {"failed": 0, "short_outputs": 0, "duration_s": d} for t, d in durations.items()}
    path.write_text(json.dumps({"kind": "soarpack.bench", "version": 2, "tiers": tiers, **top}))
    return path


def eval_json(path, overall, **extra):
    path.write_text(json.dumps({"kind": "soarpack.eval", "complete": True, "overall_accuracy": overall, "scored": 1,
                                "total": 1, **extra}))
    return path


OURS = {"s1": 10.0, "s8": 20.0, "smax": 30.0}


# -- score and compare ------------------------------------------------------------------------------------------


def test_a_best_time_slower_than_ours_caps_S_at_100_and_says_so(tmp_path):
    # The leaderboard's best includes ours once we submit: a slower "best" means ours would be the best, S = 100.
    result = final_score(OURS, {"s1": 20.0, "s8": 20.0, "smax": 15.0}, None)
    assert result["tier_scores"] == {"s1": 100.0, "s8": 100.0, "smax": 50.0}
    assert result["speed_score"] == pytest.approx(0.4 * 100 + 0.3 * 100 + 0.3 * 50)
    assert result["capped"] == ["s1"] and "S capped at 100 for s1" in result["notes"][0]
    ours = bench_json(tmp_path / "ours.json", OURS)
    cli = run_cli("score", "--ours", ours, "--best-s1", 20, "--best-s8", 20, "--best-smax", 30, "--json")
    assert cli.exit_code == 0, cli.output
    doc = json.loads(cli.stdout[cli.stdout.index("{"):])
    assert max(doc["tier_scores"].values()) <= 100 and doc["final_score"] == 100.0 and doc["capped"] == ["s1"]
    assert "S capped at 100 for s1" in " ".join(cli.output.split())


@pytest.mark.parametrize("where", ["ours-file", "best-flag"])
def test_a_subnormal_duration_is_refused_not_scored_infinite(tmp_path, where):
    tiny = 5e-324  # the sweep's subnormal: 100 x best / it is inf
    ours = bench_json(tmp_path / "ours.json", {**OURS, "s1": tiny} if where == "ours-file" else OURS)
    args = ["score", "--ours", ours, "--best-s1", tiny if where == "best-flag" else 5, "--best-s8", 5, "--best-smax", 5]
    result = run_cli(*args)
    one_error_line(result, "s1", "not a positive finite number")
    with pytest.raises(InputDataError):
        final_score({**OURS, "s1": tiny}, OURS, None)


def test_an_overall_accuracy_of_nan_gets_no_credit(tmp_path):
    ours = bench_json(tmp_path / "ours.json", OURS)
    nan = eval_json(tmp_path / "nan.json", math.nan)  # json.dumps writes NaN, json.loads reads it back
    result = run_cli("score", "--ours", ours, "--eval", nan, "--best-s1", 10, "--best-s8", 20, "--best-smax", 30)
    one_error_line(result, "overall_accuracy is nan")
    with pytest.raises(InputDataError, match="overall_accuracy"):
        load_runs([nan])
    with pytest.raises(ValueError):
        c_factor(math.nan)  # NaN compares false with every bound: it would have been C = 1
    with pytest.raises(InputDataError):
        final_score(OURS, OURS, math.nan)


@pytest.mark.parametrize("value", ["high", None, [99.5], True, -1, 100.5])
def test_score_of_a_non_numeric_overall_accuracy_is_one_error_line(tmp_path, value):
    ours = bench_json(tmp_path / "ours.json", OURS)
    bad = eval_json(tmp_path / "bad.json", value)
    result = run_cli("score", "--ours", ours, "--eval", bad, "--best-s1", 10, "--best-s8", 20, "--best-smax", 30)
    one_error_line(result, "bad.json: overall_accuracy is", "not a number from 0 to 100")
    one_error_line(run_cli("compare", bad, ours), "overall_accuracy")


def test_an_eval_whose_accuracies_disagree_is_refused(tmp_path):
    # hand-edited: overall 100 over an ori of 50 would pass the gate that the ori says it fails
    edited = eval_json(tmp_path / "e.json", 100.0, ori_accuracy=50.0)
    with pytest.raises(InputDataError, match="not what ori_accuracy 50 gives"):
        load_runs([edited])


def test_row_scores_that_are_not_numbers_are_refused_by_compare(tmp_path):
    rows = [{"index": 0, "task": "qa", "score": "1"}]
    bad = eval_json(tmp_path / "e.json", 100.0, ori_accuracy=80.0, rows=rows)
    one_error_line(run_cli("compare", bad), "row 0 score is '1'")


def _eval_from(server_model, tmp_path, label):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"task": "qa", "question": f"q{i}", "gold": ["x"]}) + "\n" for i in range(4)))
    out = tmp_path / f"eval-{server_model}.json"
    with FakeSGLang(model_id=server_model, chat=lambda q: ChatReply("</think>x")) as server:
        run_eval(EvalConfig(api_base=server.url, data=data, output=out, label=label))
    return out


def test_compare_notes_an_eval_and_a_bench_of_different_servers_under_one_label(tmp_path):
    evaluated = _eval_from("sala-w4", tmp_path, "mine")
    measured = {"label": "mine", "bundle": None, "served_model": {"id": "sala-bf16", "root": "/models/bf16"}}
    benched = bench_json(tmp_path / "bench.json", OURS, api_base="http://10.0.0.9:30000", model="sala-bf16",
                         measured=measured)
    runs = load_runs([evaluated, benched])
    assert [r.name for r in runs] == ["mine"]  # still one run: the label is the user's word
    notes = runs[0].notes
    assert any("different served models" in n and "sala-w4" in n and "sala-bf16" in n for n in notes), notes
    assert any("different servers" in n for n in notes), notes
    table = run_cli("compare", evaluated, benched)
    assert table.exit_code == 0, table.output
    assert "note: run 'mine' joins results of different served models" in " ".join(table.stdout.split())
    csv = run_cli("compare", evaluated, benched, "--table", "csv").stdout.splitlines()
    assert csv[0].endswith(",notes") and "different served models" in csv[1]
    as_json = json.loads(run_cli("compare", evaluated, benched, "--json").stdout)
    assert any("different served models" in n for n in as_json["runs"][0]["notes"])
    # the same server and model for both: nothing to note
    same = bench_json(tmp_path / "same.json", OURS, measured={"label": "mine", "served_model": {"id": "sala-w4"}})
    assert not any("served models" in n for n in load_runs([evaluated, same])[0].notes)


def test_compare_with_a_given_best_slower_than_a_run_caps_and_notes(tmp_path):
    runs = load_runs([bench_json(tmp_path / "a.json", OURS, measured={"label": "a"})])
    best = score_runs(runs, {"s1": 20.0})
    assert runs[0].scores["s1"] == 100.0 and best["s1"] == 20.0
    assert any(n.startswith("S capped at 100 for s1") for n in runs[0].notes)
    assert "note: S capped at 100 for s1" in render(runs, "table", best)


@pytest.mark.parametrize("command", ["score", "compare"])
def test_deep_nested_json_results_are_one_error_line(tmp_path, command):
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    args = (["score", "--ours", deep, "--best-s1", 1, "--best-s8", 1, "--best-smax", 1] if command == "score"
            else ["compare", deep])
    one_error_line(run_cli(*args), "deep.json")


def test_an_eval_output_of_deep_nested_json_is_one_error_line_not_resumed(tmp_path):
    deep = tmp_path / "e.json"
    deep.write_text(DEEP)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"task": "qa", "question": "q", "gold": ["x"]}) + "\n")
    with FakeSGLang() as server:
        result = run_cli("eval", "--api-base", server.url, "--data", data, "-o", deep)
        assert server.chat_bodies == []  # refused before any request
    one_error_line(result, "e.json exists but is not JSON")
    assert deep.read_text() == DEEP  # kept as it was


# -- the MANIFEST -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_bundle(tmp_path_factory.mktemp("b39") / "b.tar.gz", wheels=False, rows=256)


def _edited(built, tmp_path, edit) -> Path:
    root = safe_extract(built.path, tmp_path / "x")
    data = json.loads((root / MANIFEST_NAME).read_text())
    edit(data)
    (root / MANIFEST_NAME).write_text(json.dumps(data, indent=2))
    return write_tarball(root, tmp_path / "edited.tar.gz")


@pytest.mark.parametrize("fmt", [1.0, True])
def test_a_manifest_format_of_1_0_or_true_is_refused(built, fmt):
    data = json.loads(json.dumps(built.manifest))
    data["format"] = fmt
    with pytest.raises(SoarpackError, match=f"format {fmt!r} is not one this soarpack"):
        parse_manifest(data, "b.tar.gz")


@pytest.mark.parametrize("field, value", [("rows_asked", math.nan), ("rows_asked", -5), ("rows_asked", 2.5),
                                          ("source-rows", math.nan), ("source-rows", -1), ("task-rows", -3)])
def test_nan_or_negative_calibration_counts_are_refused(built, tmp_path, field, value):
    def edit(data):
        calibration = data["quantize"]["calibration"]
        if field == "rows_asked":
            calibration["rows_asked"] = value
        elif field == "source-rows":
            calibration["sources"][0]["rows"] = value
        else:
            calibration["sources"][0]["tasks"] = {"niah": value}

    bundle = _edited(built, tmp_path, edit)
    with pytest.raises(SoarpackError, match="calibration"):
        inspect_bundle(bundle)
    report = check_bundle(bundle, rehearse=False)
    step = next(s for s in report.steps if s.name == "structure")
    assert step.status == "fail" and "calibration" in step.detail, step.detail


@pytest.mark.parametrize("extra", [["--rows", "8"], ["--rows=8"], ["-n", "8"], ["--rows", "256", "--rows", "8"]])
def test_extra_args_rows_contradicting_the_calibration_record_fail_check(built, tmp_path, extra):
    assert built.manifest["quantize"]["extra_args"] == ["--rows", "256"]
    bundle = _edited(built, tmp_path, lambda d: d["quantize"].update(extra_args=extra))
    root = safe_extract(bundle, tmp_path / "y")
    manifest = parse_manifest(json.loads((root / MANIFEST_NAME).read_text()), "edited")
    problems = consistency_problems(root, manifest)
    assert any("quantize.extra_args sets --rows 8" in p and "256 rows asked" in p for p in problems), problems
    report = check_bundle(bundle, rehearse=False)
    step = next(s for s in report.steps if s.name == "structure")
    assert step.status == "fail" and "--rows 8" in step.detail, step.detail
    # as built, the record and the flags agree
    assert not [p for p in consistency_problems(safe_extract(built.path, tmp_path / "z"), parse_manifest(
        built.manifest, "built")) if "--rows" in p]


def test_a_deep_nested_manifest_is_one_error_line(built, tmp_path):
    root = safe_extract(built.path, tmp_path / "x")
    (root / MANIFEST_NAME).write_text(DEEP)
    bundle = write_tarball(root, tmp_path / "deep.tar.gz")
    with pytest.raises(SoarpackError, match="nested too deep"):
        inspect_bundle(bundle)
    one_error_line(run_cli("inspect", bundle), "MANIFEST.json is nested too deep")
    report = check_bundle(bundle, rehearse=False)
    assert not report.uploadable and "nested too deep" in json.dumps(report.to_dict())
    # the platform's own reader (standard library only) says it in one line too
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(root / layout.PREPROCESS), "--input", str(tmp_path), "--output",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "nested too deep" in proc.stderr, proc.stderr


# -- serve lint: --port ------------------------------------------------------------------------------------------

BASE = "--quantization gptq_marlin --dtype bfloat16 --attention-backend minicpm_flashinfer --cuda-graph-max-bs 32"


@pytest.mark.parametrize("flag, value", [("--port", "8000"), ("--model-path", "/models/other")])
def test_a_profile_that_sets_a_leading_platform_flag_is_an_error_that_says_ours_wins(flag, value):
    # the platform's launch line: ... --port 30000 ${SGLANG_SERVER_ARGS} ...: argparse keeps the last, ours
    (finding,) = [f for f in lint_args(f"{BASE} {flag} {value}") if flag in f.message]
    assert finding.level == "error" and finding.rule in ERROR_RULES
    assert "ours wins" in finding.message and "ignored" not in finding.message
    if flag == "--port":
        assert "health check" in finding.message and "30000" in finding.message
    # a flag the platform sets after ours is still only a warning: there ours is the one ignored
    (trailing,) = [f for f in lint_args(f"{BASE} --max-running-requests 16") if "--max-running-requests" in f.message]
    assert trailing.level == "warning" and "ours is ignored" in trailing.message


def test_build_refuses_a_profile_that_sets_the_port(tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text(f'recipe = "w4-mlp"\n[serve]\nargs = {json.dumps((BASE + " --port 8000").split())}\n'
                       '[[evidence]]\nkind = "none"\nsource = "test"\nsummary = "nothing measured"\n')
    with pytest.raises(ConfigError, match="platform-flag-wins"):
        build_bundle(tmp_path / "b.tar.gz", profile=str(profile), wheels=False)
