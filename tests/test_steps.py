"""soarpack.steps: a failed step skips exactly its dependants, with a reason derived from `needs`."""

from __future__ import annotations

import sys

import pytest

from soarpack.errors import ConfigError
from soarpack.steps import FAIL, PASS, SKIP, Done, Risk, Runner, RunReport, StepFailed, StepSkipped, step


def _steps(fail: str = "", skip: str = ""):
    def body(name):
        def run(ctx):
            ctx.append(name)
            if name == fail:
                raise StepFailed(f"{name} broke", code=7)
            if name == skip:
                raise StepSkipped("not needed here")
            return Done(f"{name} ok", data={"n": len(ctx)}, versions={"python": "3.10.0"})
        return run

    graph = {"a": (), "b": ("a",), "c": ("b",), "d": ("a",), "e": (), "f": ("c", "e")}
    return [step(n, needs=needs, gates=n in "cf")(body(n)) for n, needs in graph.items()]


def test_a_failed_step_skips_exactly_its_dependants_with_a_derived_reason():
    ran, events = [], []
    report = Runner(_steps(fail="b"), events.append).run(ran)
    assert report.status() == {"a": PASS, "b": FAIL, "c": SKIP, "d": PASS, "e": PASS, "f": SKIP}
    assert ran == ["a", "b", "d", "e"]  # the skipped ones never ran
    assert report["b"].data == {"code": 7} and report["b"].detail == "b broke"
    assert report["c"].data == {"blocked_by": "b", "cause": "b"} and report["c"].detail == "needs b, which failed"
    assert report["f"].data == {"blocked_by": "c", "cause": "b"} and report["f"].detail == "needs c; b failed"
    assert report.gate() == {"failed": ["b"], "not_run": ["c", "f"], "risks": []} and not report.ok


def test_a_skipped_step_passes_its_reason_on():
    report = Runner(_steps(skip="a")).run([])
    assert [s.name for s in report.steps if s.status == PASS] == ["e"]
    assert report["d"].detail == "needs a, which was skipped: not needed here"
    assert report["f"].detail == "needs c; a was skipped: not needed here" and report.ok


def test_every_step_is_timed_versioned_and_reported_as_events():
    events = []
    report = Runner(_steps(), events.append).run([])
    assert all(s.status == PASS and s.seconds >= 0 and s.versions == {"python": "3.10.0"} for s in report.steps)
    assert report["f"].data == {"n": 6} and report["f"].needs == ("c", "e") and report["f"].gates
    assert [(e.kind, e.phase) for e in events][:2] == [("start", "a"), ("end", "a")]
    assert [e.result.name for e in events if e.kind == "end"] == list("abcdef")
    assert report.versions["python"] == sys.version.split()[0]
    assert report.gate() == {"failed": [], "not_run": [], "risks": []}


def test_a_soarpack_error_fails_the_step_and_a_bug_propagates():
    @step("bad input")
    def bad(ctx):
        raise ConfigError("no such recipe", "see --help")

    @step("bug")
    def bug(ctx):
        raise KeyError("x")

    assert Runner([bad]).run(None)["bad input"].detail.startswith("no such recipe")
    with pytest.raises(KeyError):
        Runner([bug]).run(None)


def test_a_need_must_be_declared_before_it_is_needed():
    a, b = _steps()[:2]
    with pytest.raises(ValueError, match="needs \\['a'\\]"):
        Runner([b, a])
    with pytest.raises(ValueError, match="declared twice"):
        Runner([a, a])


def test_blocking_risks_reach_the_gate():
    report = RunReport(risks=[Risk("w4-full", "measured ori 78.0", blocks=True), Risk("calib", "built-in prompts")])
    assert report.gate()["risks"] == ["w4-full"]


# -- a pipeline (quantize, build): the first step that fails ends the run ---------------------------------------


def _pipeline(error: BaseException, at: str = "b"):
    def body(name):
        def run(ctx):
            ctx.append(name)
            if name == at:
                raise error
        return run

    return [step(n, needs=needs)(body(n)) for n, needs in {"a": (), "b": ("a",), "c": ("b",)}.items()]


@pytest.mark.parametrize("error, how", [(ConfigError("--rows 0 is not a row count"), "failed"),
                                        (KeyboardInterrupt(), "interrupted"), (OSError(28, "no space"), "failed")])
def test_a_pipeline_raises_the_first_failure_as_it_is_and_says_how_the_step_ended(error, how):
    ran, events = [], []
    with pytest.raises(type(error)) as raised:
        Runner(_pipeline(error), events.append, stop_at_failure=True).run(ran)
    assert raised.value is error and ran == ["a", "b"]  # nothing after it ran
    assert [(e.kind, e.phase, e.message) for e in events] == [("start", "a", ""), ("end", "a", ""),
                                                              ("start", "b", ""), ("end", "b", how)]
    assert events[1].result.status == PASS and events[3].result is None  # it raised: no result to show


def test_a_rehearsal_records_a_failure_and_goes_on_where_a_pipeline_stops():
    ran = []
    report = Runner(_pipeline(ConfigError("bad"))).run(ran)
    assert report.status() == {"a": PASS, "b": FAIL, "c": SKIP} and ran == ["a", "b"]


def test_a_skip_in_a_pipeline_still_skips_its_dependants():
    ran = []
    report = Runner(_pipeline(StepSkipped("nothing to do")), stop_at_failure=True).run(ran)
    assert report.status() == {"a": PASS, "b": SKIP, "c": SKIP} and ran == ["a", "b"]
    assert report["c"].detail == "needs b, which was skipped: nothing to do"


def test_steps_that_say_their_own_lines_are_not_announced():
    events = []
    Runner(_pipeline(StepSkipped("x"), at="none"), events.append, stop_at_failure=True, announce=False).run([])
    assert events == []
    with pytest.raises(ConfigError):
        Runner(_pipeline(ConfigError("bad")), events.append, stop_at_failure=True, announce=False).run([])
    assert events == []
