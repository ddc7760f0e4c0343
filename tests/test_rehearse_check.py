"""`soarpack check` as declared steps, on cheap inputs: the shape of the report is the list of steps whatever broke,
skip reasons and the upload gate come from the declarations, a failed rehearsal keeps its logs and names the
`soarpack diagnose` command that reads them, and risks beside the steps reach the verdict and the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.bundle.tarpack import pack_tree
from soarpack.cli import app
from soarpack.rehearse import check as C
from soarpack.steps import FAIL, PASS, SKIP, Done, Risk, StepFailed, StepResult, step

runner = CliRunner()


def _not_a_tar(tmp_path) -> Path:
    """gzip content that is no tar: a bundle that passes size and fails extract."""
    import gzip

    path = tmp_path / "broken.tar.gz"
    path.write_bytes(gzip.compress(b"not a tar archive\n" * 64))
    return path


def test_a_bundle_that_does_not_extract_fails_extract_and_every_later_step_says_so(tmp_path):
    report = C.check_bundle(_not_a_tar(tmp_path))
    assert [s.name for s in report.steps] == [s.name for s in C.STEPS]
    assert report["size"].status == PASS and report["extract"].status == FAIL
    assert all(s.status == SKIP and s.data["cause"] == "extract" for s in report.steps[2:])
    assert report["structure"].detail == "needs extract, which failed"
    assert report["verify"].detail == "needs prepare_model.sh; extract failed"
    assert report.logs_dir is None  # nothing ran that logs


@pytest.mark.parametrize("kind", ["missing", "directory", "not gzip", "empty"])
def test_a_bundle_path_that_is_no_bundle_is_bad_input_not_a_verdict(tmp_path, kind):
    """Issue 27 item 4: `check nosuch.tar.gz` is one error line with the fix and exit 2, as everywhere else."""
    from soarpack.errors import SoarpackError

    path = {"missing": tmp_path / "nosuch.tar.gz", "directory": tmp_path}.get(kind, tmp_path / "b.tar.gz")
    if kind == "not gzip":
        path.write_text("hello\n")
    elif kind == "empty":
        path.write_bytes(b"")
    said = {"missing": "does not exist", "directory": "is a directory", "not gzip": "not gzip",
            "empty": "an empty file"}[kind]
    with pytest.raises(SoarpackError, match=said) as exc:
        C.check_bundle(path)
    assert exc.value.hint and exc.value.exit_code == 2
    for args in ([], ["--json"], ["--no-rehearse"]):
        res = runner.invoke(app, ["check", str(path), *args])
        assert res.exit_code == 2, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert lines[0].startswith("error: ") and said in " ".join(res.output.split()), res.output
        assert "uploadable" not in res.output and "Traceback" not in res.output and "hint:" in res.output


def test_the_upload_gate_is_declared_on_the_steps():
    assert [s.name for s in C.STEPS if s.gates] == ["prepare_env.sh", "bundled wheels", "prepare_model.sh", "verify"]
    needs = {s.name: s.needs for s in C.STEPS}
    assert needs["image stand-in"] == C.STATIC_CHECKS and needs["fork loads it"] == ("prepare_model.sh",)


def test_no_message_names_a_deprecated_flag():
    source = Path(C.__file__).read_text()
    assert "--sglang-fork" not in source and "--sglang-src" in source


def test_adding_a_step_is_one_function_and_one_line(tmp_path, monkeypatch):
    @step("served tokens", needs=["verify"])
    def served_tokens(c):
        return Done("not reached")

    monkeypatch.setattr(C, "STEPS", [*C.STEPS, served_tokens])
    report = C.check_bundle(_not_a_tar(tmp_path))
    assert report["served tokens"].status == SKIP and report["served tokens"].data == {"blocked_by": "verify", "cause": "extract"}


@pytest.fixture
def tiny_tarball(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "prepare_env.sh").write_text("true\n")
    return pack_tree(tree, tmp_path / "b.tar.gz")


def _failing_rehearsal(monkeypatch):
    @step("rehearse", needs=["extract"], gates=True)
    def rehearse(c):
        c.keep_log("rehearse.log", "Traceback (most recent call last):\nImportError: cannot import name 'ScalingType'\n")
        raise StepFailed("exit 1: ImportError", exit_code=1)

    @step("after", needs=["rehearse"])
    def after(c):
        return "never"

    monkeypatch.setattr(C, "STEPS", [C.size, C.extract, rehearse, after])


def test_a_failed_rehearsal_keeps_its_logs_and_says_how_to_read_them(tiny_tarball, monkeypatch):
    _failing_rehearsal(monkeypatch)
    report = C.check_bundle(tiny_tarball)
    assert report.status() == {"size": PASS, "extract": PASS, "rehearse": FAIL, "after": SKIP}
    kept = Path(report.logs_dir)
    assert "ImportError" in (kept / "rehearse.log").read_text()  # the temp folder went, the logs stayed
    assert json.loads((kept / "check.json").read_text())["gate"]["failed"] == ["rehearse"]
    res = runner.invoke(app, ["check", str(tiny_tarball)])
    assert res.exit_code == 1
    kept_cli = res.stderr.split("logs: the rehearsal's logs are kept in ")[1].split(";")[0]
    assert f"soarpack diagnose {kept_cli}" in " ".join(res.stderr.split()) and Path(kept_cli, "rehearse.log").is_file()
    assert res.stdout.splitlines()[-1].startswith("NOT uploadable (failed: rehearse)")
    data = json.loads(runner.invoke(app, ["check", str(tiny_tarball), "--json"]).stdout)
    assert data["diagnose"] == f"soarpack diagnose {data['logs_dir']}" and Path(data["logs_dir"], "rehearse.log").is_file()


def test_with_keep_the_logs_stay_in_the_rehearsal_folder(tiny_tarball, tmp_path, monkeypatch):
    _failing_rehearsal(monkeypatch)
    report = C.check_bundle(tiny_tarball, work_dir=tmp_path / "keep", keep=True)
    assert report.logs_dir == str(tmp_path / "keep") and (tmp_path / "keep" / "logs" / "rehearse.log").is_file()


def _passed(stack=C.IMAGE_STACK, risks=()):
    steps = [StepResult(s.name, PASS, gates=s.gates, needs=s.needs) for s in C.STEPS]
    return C.CheckReport(steps=steps, stack=stack, risks=list(risks))


def test_a_step_can_add_a_risk_that_reaches_the_gate(tmp_path, tiny_tarball, monkeypatch):
    @step("risks", needs=["extract"])
    def risks(c):
        c.report.risks.append(Risk("w4-full", "w4-full measured ori 78.0 on the platform (C = 0.92)", blocks=True))
        return Done("1 risk", {"risks": 1})

    monkeypatch.setattr(C, "STEPS", [C.size, C.extract, risks])
    report = C.check_bundle(tiny_tarball)
    assert report.ok and report.gate()["risks"] == ["w4-full"] and not report.uploadable
    assert C.verdict(report).startswith("NOT uploadable (w4-full: full credit unlikely; pass --accept-risk w4-full to upload anyway); 1 risk: w4-full --")


def test_risks_go_into_the_verdict_and_a_blocking_one_into_the_gate():
    assert C.verdict(_passed()) == f"uploadable -- {len(C.STEPS)} passed, 0 failed, 0 skipped on the image stack"
    two = _passed(risks=[Risk("calib", "built-in calibration prompts"), Risk("rows", "12 of 256 rows")])
    assert two.uploadable and C.verdict(two).startswith("uploadable, 2 risks: calib, rows --")
    blocking = _passed(risks=[Risk("w4-full", "w4-full measured ori 78 (C = 0.92)", blocks=True)])
    assert not blocking.uploadable and blocking.gate()["risks"] == ["w4-full"]
    assert C.verdict(blocking).startswith("NOT uploadable (w4-full: full credit unlikely")
    accepted = C.CheckReport(steps=blocking.steps, risks=blocking.risks, accepted=["w4-full"])
    assert accepted.uploadable and C.verdict(accepted).startswith("uploadable, 1 risk: w4-full (accepted) --")
    strict = C.CheckReport(steps=blocking.steps, risks=two.risks, strict=True)
    assert not strict.uploadable and strict.gate()["risks"] == ["calib", "rows"]
    assert blocking.to_dict()["risks"] == [{"name": "w4-full", "message": "w4-full measured ori 78 (C = 0.92)", "source": "",
                                            "blocks": True}]
    assert not _passed(stack=C.DEV_STACK).uploadable
