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
