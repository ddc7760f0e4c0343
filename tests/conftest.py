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

_NEEDS_TORCH = ("import torch", "from torch", "soarpack.sala", "soarpack.quant", "tiny_model_dir", "gptqmodel")


def pytest_ignore_collect(collection_path, config):
    if HAVE_TORCH or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    text = collection_path.read_text(encoding="utf-8", errors="replace")
    if any(marker in text for marker in _NEEDS_TORCH):
        return True
    return None


def pytest_report_header(config):
    if not HAVE_TORCH:
        return "torch is not installed: test files that need torch are left out (Python 3.10 leg)"
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
