"""The platform's facts have one address, soarpack.facts: no other module of soarpack types one again (in code,
docstrings or comments), and what cannot import the package (pyproject.toml, prepare_env.sh, the fork child) is
held equal to it here."""

from __future__ import annotations

import ast
import io
import json
import re
import shlex
import tokenize
from pathlib import Path
from typing import Iterator, List, Tuple

from soarpack import facts
from soarpack.facts import engine, gpu, image, launch, limits, scoring

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "soarpack"
FACTS_DIR = PACKAGE / "facts"


def _number(value: float) -> str:
    return re.escape(f"{value:g}")


def _version(text: str) -> str:
    return rf"(?<![\w.]){re.escape(text)}(?![\w]|\.\d)"


def _word(text: str) -> str:  # a number or flag standing on its own, not inside a longer one
    return rf"(?<![\w.-]){re.escape(text)}(?![\w-]|\.\d)"


# Each listed fact: a name, and the pattern that finds it typed as text (a string, a docstring or a comment).
TEXT_FACTS: List[Tuple[str, str]] = [
    *[(f"image pin {name}", _version(version)) for name, version in image.PINS.items()],
    ("engine pin gptqmodel", _version(engine.GPTQMODEL)),
    ("dev torch pin", _version(engine.DEV_TORCH)),
    ("upload limit", rf"(?<![\w.]){_number(limits.UPLOAD_MAX_BYTES / 1e9)} ?GB\b"),
    ("baseline accuracy", _word(f"{scoring.BASELINE_ACCURACY:g}")),
    *[(f"C threshold {bound:g}", _word(f"{bound:g}")) for bound, _ in scoring.C_STEPS],
    *[(f"C line ori {ori:g}", _version(f"{ori:g}")) for ori, _ in scoring.C_ORI_LINES],
    ("eval max_tokens", _word(str(limits.EVAL_MAX_TOKENS))),
    *[(f"launch flag {flag}", _word(flag)) for flag in (launch.TRUST_REMOTE_CODE_FLAG, launch.TP_SIZE_FLAG,
                                                         launch.MAX_RUNNING_FLAG, launch.METRICS_FLAG)],
    ("default SGLANG_SERVER_ARGS", re.escape(" ".join(launch.DEFAULT_SERVER_ARGS.split()[-4:]))),
    ("GPU name", re.escape(gpu.NAME.split(" (")[0])),
]
# Each listed fact as a number in code: (name, value, type). Floats only where an int of that value means other
# things (80 columns, the 99th percentile).
NUMBER_FACTS: List[Tuple[str, float, type]] = [
    ("baseline accuracy", scoring.BASELINE_ACCURACY, float),
    *[(f"C threshold {bound:g}", bound, float) for bound, _ in scoring.C_STEPS],
    *[(f"C line ori {ori:g}", ori, float) for ori, _ in scoring.C_ORI_LINES],
    ("upload limit", limits.UPLOAD_MAX_BYTES, int),
    ("eval max_tokens", limits.EVAL_MAX_TOKENS, int),
    ("eval timeout", limits.EVAL_TIMEOUT_S, float),
    ("launch port", launch.PORT, int),
]


def _sources() -> List[Path]:
    """soarpack/ but the facts package, the benchmarks and preprocess_model.py."""
    files = [p for p in PACKAGE.rglob("*.py") if FACTS_DIR not in p.parents]
    return sorted(files + list((ROOT / "benchmarks").glob("*.py")) + [ROOT / "preprocess_model.py"])


def _texts(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, text) of every string constant (docstrings and f-string parts included) and every comment."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    # soarpack's own option names (`typer.Option(False, "--trust-remote-code")`) are its CLI, not a platform fact
    own_options = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
                   and getattr(node.func, "attr", getattr(node.func, "id", "")) == "Option" for arg in node.args}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in own_options:
            yield node.lineno, node.value
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def _numbers(path: Path) -> Iterator[Tuple[int, object]]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            yield node.lineno, node.value


def test_the_check_sees_every_kind_of_place(tmp_path):
    """The scanner finds a fact in a docstring, a comment, an f-string part and a number."""
    sample = tmp_path / "m.py"
    sample.write_text(f'"""torch {image.TORCH}"""\n# C = 1 above {scoring.FULL_CREDIT_ORI:g}\n'
                      f'x = f"{{y}} {launch.TP_SIZE_FLAG} 1"\nz = {scoring.BASELINE_ACCURACY!r}\n', encoding="utf-8")
    texts = [text for _, text in _texts(sample)]
    found = {name for name, pattern in TEXT_FACTS for text in texts if re.search(pattern, text)}
    assert {"image pin torch", f"C line ori {scoring.FULL_CREDIT_ORI:g}", f"launch flag {launch.TP_SIZE_FLAG}"} <= found
    assert any(v == scoring.BASELINE_ACCURACY and type(v) is float for _, v in _numbers(sample))


def test_no_platform_fact_is_typed_outside_the_facts_package():
    offenders = []
    for path in _sources():
        rel = path.relative_to(ROOT)
        for line, text in _texts(path):
            for name, pattern in TEXT_FACTS:
                if re.search(pattern, text):
                    offenders.append(f"{rel}:{line}: {name} in {text.strip()[:70]!r}")
        for line, value in _numbers(path):
            for name, fact, kind in NUMBER_FACTS:
                if type(value) is kind and value == fact:
                    offenders.append(f"{rel}:{line}: {name} as the number {value!r}")
    assert offenders == [], "import it from soarpack.facts:\n" + "\n".join(sorted(set(offenders)))


def test_the_derived_lines_follow_the_baseline_and_the_steps():
    assert scoring.FULL_CREDIT_ORI == round(scoring.C_STEPS[-1][0] * scoring.BASELINE_ACCURACY / 100, 4)
    assert scoring.NO_CREDIT_ORI == round(scoring.C_STEPS[0][0] * scoring.BASELINE_ACCURACY / 100, 4)
    from soarpack.measure.scoring import c_factor, overall_accuracy

    assert c_factor(overall_accuracy(scoring.FULL_CREDIT_ORI + 0.01)) == scoring.C_FULL
    assert c_factor(overall_accuracy(scoring.FULL_CREDIT_ORI)) < scoring.C_FULL
    assert c_factor(overall_accuracy(scoring.NO_CREDIT_ORI)) == 0.0 < c_factor(overall_accuracy(scoring.NO_CREDIT_ORI + 0.01))


def test_the_facts_package_is_data_on_the_standard_library():
    for path in FACTS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert all(n.split(".")[0] in ("typing", "soarpack") for n in names), f"{path.name}: {names}"
                assert all(n in ("typing", "soarpack.facts") for n in names), f"{path.name}: {names}"
    assert sorted(facts.__all__) == sorted(p.stem for p in FACTS_DIR.glob("*.py") if p.stem != "__init__")


# -- what cannot import soarpack.facts, held equal to it ------------------------------------------------------------


def test_the_install_script_and_the_readme_pin_the_dev_torch():
    """scripts/install.sh and the README's pip lines pin torch as soarpack.facts.engine.DEV_TORCH says."""
    script = (ROOT / "scripts" / "install.sh").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert script.count(f'"{engine.DEV_TORCH_SPEC}"') == 2
    pins = re.findall(r"torch==[\w.+]+", script + readme)
    assert pins and set(pins) == {engine.DEV_TORCH_SPEC}, pins


def test_pyproject_pins_the_engine_and_lists_the_forks_import_packages():
    from soarpack import _toml

    project = _toml.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert extras["quant"] == [engine.GPTQMODEL_SPEC]
    assert sorted(extras["fork-check"]) == sorted(image.FORK_IMPORT_PACKAGES)


def test_prepare_env_defaults_to_the_images_fork_checkout():
    text = (ROOT / "prepare_env.sh").read_text(encoding="utf-8")
    defaults = re.findall(r'SOARPACK_SGLANG_FORK:-([^}"]+)', text)
    assert defaults == [image.FORK_CHECKOUT]
    globs = set(re.findall(r"(/opt/[^ ]+?)/\*", text))
    assert globs == {image.FORK_CHECKOUT.rsplit("/", 2)[0]}


def test_the_fork_child_gets_the_launch_line_and_the_gpu_in_its_request():
    from soarpack.serve import forkcheck

    req = forkcheck.platform_request()
    assert req["gpu"] == gpu.as_request()
    served = [req["launch"]["model_path_flag"], "CKPT", *req["launch"]["before"], "--x", *req["launch"]["after"]]
    full = launch.server_argv("CKPT", ["--x"])
    assert served == [a for a in full if a != launch.METRICS_FLAG]
    child = forkcheck.CHILD_SCRIPT.read_text(encoding="utf-8")
    for name, pattern in TEXT_FACTS:  # the child's own copy would drift: it holds none
        assert not re.search(pattern, child), name


def test_the_image_stand_in_builds_from_the_facts():
    from soarpack import imagestack

    assert imagestack.IMAGE_PINS == image.PIN_SPECS
    assert tuple(imagestack.FORK_IMPORT_PACKAGES) == image.FORK_IMPORT_PACKAGES
    assert f"torch{image.TORCH}" in imagestack.stack_dir().name


def test_the_platform_lock_was_resolved_for_the_facts():
    lock = json.loads((PACKAGE / "bundle" / "platform-lock.json").read_text(encoding="utf-8"))
    assert lock["python"] == image.PYTHON and lock["image_torch"] == image.TORCH
    assert engine.GPTQMODEL_SPEC in lock["roots"]


def test_the_server_launch_line_is_the_facts_one():
    from soarpack.serve.server import launch_command

    cmd = launch_command("CKPT", ["--a", "b"], launch.PORT, python="py")
    assert cmd == ["py", "-m", launch.MODULE, *launch.server_argv("CKPT", ["--a", "b"])]
    assert shlex.split(launch.DEFAULT_SERVER_ARGS)[:1] == ["--disable-radix-cache"]
