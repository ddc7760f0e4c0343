import os

import pytest

os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny SALA checkpoint (4 layers: sparse, lightning, lightning, sparse), built once per test session."""
    from soarpack.sala.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def golden_dir():
    """The reference logits from MiniCPM-SALA's own HF code (../shared/data/golden-sala-tiny)."""
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent
    for candidate in (here.parent / "shared" / "data" / "golden-sala-tiny", here / "shared" / "data" / "golden-sala-tiny"):
        if (candidate / "cases.safetensors").is_file():
            return candidate
    pytest.skip("golden-sala-tiny reference data not found beside the checkout (../shared/data)")


# Under the Python 3.10 leg (scripts/test-py310.sh) torch is absent: leave out the test files that need it.
try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

# The test files that need torch (directly, or through a tiny model or GPTQModel). The Python 3.10 leg has no torch:
# it leaves out exactly these, by name, and says so; any other file is collected there, so a file that needs torch
# and is missing here fails loudly instead of vanishing (test_conftest_torch_list checks the list with torch blocked).
NEEDS_TORCH = frozenset({
    "test_bundle_e2e.py", "test_quant_calib.py", "test_quant_e2e.py", "test_quant_format.py",
    "test_quant_platform.py", "test_quant_sanity.py", "test_sala_gla.py", "test_sala_model.py", "test_sala_tiny.py",
    "test_sweep_quant.py", "test_conftest_torch_list.py", "test_bundle_forkstep.py", "test_image_stack.py",
    "test_serve_forkcheck.py", "test_quant_glacheck.py", "test_quant_quiet.py", "test_sala_streaming.py",
    "test_quant_engine.py", "test_w4_dispatch.py", "test_verdicts_calibration.py", "test_kernels_splitk.py",
    "test_fp8_prefill.py",
    "test_gla_decode.py",
})


def pytest_ignore_collect(collection_path, config):
    if not HAVE_TORCH and collection_path.name in NEEDS_TORCH:
        return True
    return None


# Inside the other files, the tests that need torch all the same: they use a tiny model, or say so with a mark.
TORCH_FIXTURES = frozenset({"tiny_model_dir"})


def pytest_collection_modifyitems(config, items):
    if HAVE_TORCH:
        return
    skip = pytest.mark.skip(reason="not run: needs torch, which the Python 3.10 leg lacks (the main leg runs it)")
    for item in items:
        if item.get_closest_marker("needs_torch") or TORCH_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(skip)


def pytest_report_header(config):
    if not HAVE_TORCH:
        return "torch is not installed: left out (Python 3.10 leg): " + ", ".join(sorted(NEEDS_TORCH))
    return None


FORK_COMMITS = ("377b0b5eb", "d29fb130c")


def _fork_archive_dir():
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent
    for base in (here, *here.parents):  # ../shared beside the checkout, or further up for a worktree
        candidate = base / "shared" / "data" / "sglang-fork"
        if all((candidate / f"{c}-python.tar.gz").is_file() for c in FORK_COMMITS):
            return candidate
    return None


@pytest.fixture(scope="session")
def sglang_fork_trees(tmp_path_factory):
    """{commit: python/ dir} of the OpenBMB fork, extracted once per session from ../shared/data/sglang-fork."""
    import tarfile

    archives = _fork_archive_dir()
    if archives is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the SGLang fork archives (../shared/data/sglang-fork) are missing in CI")
        pytest.skip("not run: the SGLang fork archives (../shared/data/sglang-fork) are not beside the checkout")
    trees = {}
    for commit in FORK_COMMITS:
        dest = tmp_path_factory.mktemp(f"sglang-{commit}")
        with tarfile.open(archives / f"{commit}-python.tar.gz") as tar:
            tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        trees[commit] = dest / "python"
    return trees


@pytest.fixture(scope="session")
def patched_fork_trees(sglang_fork_trees, tmp_path_factory):
    """{commit: python/ dir} of the fork with soarpack's whole patch set applied (read only: tests that write copy)."""
    from soarpack.serve import patches as P

    out = {}
    for commit, src in sglang_fork_trees.items():
        out[commit] = tmp_path_factory.mktemp(f"patched-{commit}") / "python"
        P.apply_patches(src, out[commit])
    return out


@pytest.fixture(scope="session")
def image_python():
    """The image stand-in's python (CPython 3.10 with the fork's pins); skipped where it cannot be built, outside CI."""
    from soarpack.imagestack import ImageStackError, ensure_image_stack

    try:
        return ensure_image_stack().python
    except ImageStackError as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"not run: the image stand-in is not available here ({exc})")
