"""The build's lock compatibility check: every bundled wheel's Requires-Python and Requires-Dist, evaluated for
CPython 3.10 against the bundled set and the image's pins, with the NOT_BUNDLED exemptions honoured."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from soarpack.bundle.build import build_bundle
from soarpack.bundle.wheels import WheelError, image_compatibility_problems, make_pure_wheel, pip_check_problems
from soarpack.cli import app


def test_a_wheel_needing_a_newer_torch_than_the_image_is_named(tmp_path):
    w = make_pure_wheel(tmp_path, "needs-new-torch", "1.0", requires=["torch>=2.14"])
    assert image_compatibility_problems([w]) == [
        "needs_new_torch-1.0-py3-none-any.whl: requires torch>=2.14, but the image's torch is 2.9.1"]


def test_a_wheel_for_python_311_only_is_named(tmp_path):
    w = make_pure_wheel(tmp_path, "py311-only", "1.0", requires_python=">=3.11")
    assert image_compatibility_problems([w]) == [
        "py311_only-1.0-py3-none-any.whl: Requires-Python >=3.11, the image runs CPython 3.10.12"]


def test_needs_met_by_the_set_the_image_or_an_exemption_pass(tmp_path):
    wheels = [
        make_pure_wheel(tmp_path, "gptqmodel", "1.0", requires_python=">=3.10",
                        requires=["torch>=2.8", "torchao>=0.18.0", "helper==2.0", "tomli; python_version < '3.11'",
                                  "onlyfor-311; python_version >= '3.11'", "docs-extra; extra == 'docs'"]),
        make_pure_wheel(tmp_path, "helper", "2.0"),
        make_pure_wheel(tmp_path, "tomli", "2.5.0"),
    ]
    assert image_compatibility_problems(wheels) == []
    other = make_pure_wheel(tmp_path / "o", "other", "1.0", requires=["torchao>=0.18.0"])
    assert image_compatibility_problems([other]) == [
        "other-1.0-py3-none-any.whl: requires torchao>=0.18.0, but the image's torchao is 0.9.0"]  # exempt for gptqmodel only


def test_a_missing_or_wrong_version_dependency_is_named(tmp_path):
    wheels = [make_pure_wheel(tmp_path, "engine", "1.0", requires=["helper>=3", "absent"]),
              make_pure_wheel(tmp_path, "helper", "2.0")]
    problems = image_compatibility_problems(wheels)
    assert "engine-1.0-py3-none-any.whl: requires helper>=3, but bundled helper is 2.0" in problems
    assert "engine-1.0-py3-none-any.whl: requires absent, which is neither bundled nor in the image" in problems


def test_build_refuses_an_incompatible_wheel_set_with_one_line(tmp_path):
    d = tmp_path / "wheels"
    make_pure_wheel(d, "needs-new-torch", "1.0", requires=["torch>=2.14"])
    with pytest.raises(WheelError, match=r"needs_new_torch-1.0-py3-none-any.whl: requires torch>=2.14"):
        build_bundle(tmp_path / "b.tar.gz", wheel_dir=d, calib_rows=8)
    assert not (tmp_path / "b.tar.gz").exists()
    res = CliRunner().invoke(app, ["build", "--wheel-dir", str(d), "-o", str(tmp_path / "c.tar.gz")])
    assert res.exit_code == 2 and "requires torch>=2.14" in res.output and "Traceback" not in res.output


def test_pip_check_reading_honours_the_exemptions():
    out = ("gptqmodel 7.6.0 requires torchao, which is not installed.\n"
           "gptqmodel 7.6.0 has requirement torchao>=0.18.0, but you have torchao 0.9.0.\n"
           "accelerate 1.15.0 requires torch, which is not installed.\n"
           "needy 1.0 requires absent-dependency, which is not installed.\n")
    assert pip_check_problems(out) == ["needy 1.0 requires absent-dependency, which is not installed."]
