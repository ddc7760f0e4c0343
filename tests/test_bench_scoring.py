"""Scoring rules of SALA.md §2, one rule per test, edge cases included."""

import pytest

from soarpack.measure.competition import final_score
from soarpack.measure.scoring import c_factor, extract_mcq, final_answer, ori_accuracy, overall_accuracy, score_prediction
from soarpack.errors import InputDataError


def test_final_answer_takes_text_after_the_last_think_and_strips_it():
    assert final_answer("a</think>b</think>  C  \n") == "C"


def test_final_answer_without_think_is_the_whole_text_unstripped():
    assert final_answer("  ANSWER: B  ") == "  ANSWER: B  "


@pytest.mark.parametrize("text, letter", [
    ("ANSWER: B", "B"),
    ("answer: b", "B"),
    ("Answer :   c and later ANSWER: D", "C"),
    ("\\boxed{\\text{B}}", "B"),
    ("\\boxed{C}", "C"),
    ("\\boxed{c}", None),            # boxed patterns are case-sensitive on the platform
    ("\\boxed{\\text{a}}", None),
    ("the answer is B", None),
    ("\\boxed{A} then ANSWER: D", "D"),  # ANSWER: wins over boxed, whatever the position
])
def test_extract_mcq_follows_the_platform_pattern_order(text, letter):
    assert extract_mcq(text) == letter


def test_mcq_is_scored_on_final_only():
    assert score_prediction("mcq", "ANSWER: A</think>ANSWER: B", "b") == (1.0, "B")
    assert score_prediction("mcq", "ANSWER: B</think>no letter here", "B") == (0.0, None)


def test_mcq_without_think_is_scored_on_everything():
    assert score_prediction("mcq", "thinking... ANSWER: C", "C")[0] == 1.0


def test_empty_prediction_or_gold_scores_zero():
    assert score_prediction("niah", "", ["x"])[0] == 0.0
    assert score_prediction("mcq", "ANSWER: A", "")[0] == 0.0
    assert score_prediction("cwe", "a b c", [])[0] == 0.0


@pytest.mark.parametrize("task", ["niah", "qa", "lcx"])
def test_any_hit_tasks_score_one_for_any_gold_in_final_case_insensitive(task):
    assert score_prediction(task, "</think>The Key is PURPLE-7", ["nothing", "purple-7"])[0] == 1.0
    assert score_prediction(task, "purple-7</think>The key is red", ["purple-7"])[0] == 0.0
    assert score_prediction(task, "It is Paris", "paris")[0] == 1.0  # a string gold counts as one gold


@pytest.mark.parametrize("task", ["cwe", "fwe"])
def test_word_list_tasks_score_the_fraction_found(task):
    gold = ["Apple", "pear", "plum", "fig"]
    assert score_prediction(task, "</think>apple, PEAR, plum", gold)[0] == pytest.approx(0.75)
    assert score_prediction(task, "apple pear plum fig</think>none", gold)[0] == 0.0


def test_unknown_task_matches_string_gold_against_the_raw_prediction():
    # The raw prediction, not `final`: a gold inside the thinking still counts.
    assert score_prediction("other", "Berlin</think>I do not know", "berlin")[0] == 1.0
    assert score_prediction("other", "Berlin", ["berlin"])[0] == 0.0  # list gold only for the known tasks


def test_accuracy_rounding_and_cap():
    scores = [1.0] * 2 + [0.0]
    assert ori_accuracy(scores) == 66.67
    assert overall_accuracy(66.67) == 83.34  # round(66.67 / 80 * 100, 2)
    assert overall_accuracy(82.5) == 100.0
    assert ori_accuracy([]) == 0.0


@pytest.mark.parametrize("overall, c", [(100.0, 1.0), (99.01, 1.0), (99.0, 0.96), (98.01, 0.96), (98.0, 0.92),
                                        (97.01, 0.92), (97.0, 0.0), (50.0, 0.0)])
def test_c_factor_thresholds(overall, c):
    assert c_factor(overall) == c


def test_gate_in_ori_terms():
    # SALA.md: ori > 79.2 gives C = 1, ori ≤ 77.6 is elimination.
    assert c_factor(overall_accuracy(79.21)) == 1.0
    assert c_factor(overall_accuracy(79.2)) == 0.96
    assert c_factor(overall_accuracy(77.6)) == 0.0
    assert c_factor(overall_accuracy(77.61)) == 0.92


def test_final_score_formula():
    ours = {"s1": 800.0, "s8": 1200.0, "smax": 2500.0}
    best = {"s1": 600.0, "s8": 1000.0, "smax": 2000.0}
    result = final_score(ours, best, overall=98.5)
    assert result["tier_scores"] == {"s1": 75.0, "s8": pytest.approx(83.3333, abs=1e-4), "smax": 80.0}
    speed = 0.4 * 75.0 + 0.3 * 100 * 1000 / 1200 + 0.3 * 80.0
    assert result["speed_score"] == pytest.approx(speed, abs=1e-4)
    assert result["final_score"] == pytest.approx(speed * 0.96, abs=1e-4)
    assert final_score(ours, best, overall=None)["c_assumed"] is True


def test_final_score_needs_all_tiers():
    with pytest.raises(InputDataError, match="smax"):
        final_score({"s1": 1.0, "s8": 1.0}, {"s1": 1.0, "s8": 1.0, "smax": 1.0}, None)
