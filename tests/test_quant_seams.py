"""What each module knows: GPTQModel only in the engine, the quality math beside the pipeline, GLA backends named
for what they run, no field or attribute without a reader, and the maintainer's flag recorder kept working."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "soarpack"


def _source(rel: str) -> str:
    return (PACKAGE / rel).read_text(encoding="utf-8")


@pytest.mark.needs_torch
def test_gptqmodel_knowledge_lives_in_the_engine_only():
    """The transformers view GPTQModel needs and where it leaves packed tensors are the engine's, not finalize's."""
    assert not (PACKAGE / "quant" / "hf_shim.py").exists()
    names = {n.name for n in ast.walk(ast.parse(_source("quant/finalize.py"))) if isinstance(n, ast.FunctionDef)}
    assert "extract_quantized" not in names and "quantization_config" not in names
    assert "gptqmodel" not in _source("quant/finalize.py").replace("GPTQModel", "")
    from soarpack.quant import engine

    assert {"packed", "module_losses", "region_seconds"} <= set(engine.GptqResult.__dataclass_fields__)
    assert "quantized_model" not in engine.GptqResult.__dataclass_fields__


@pytest.mark.needs_torch
def test_the_quality_math_sits_beside_the_pipeline():
    from soarpack.quant import quality, run

    for name in ("next_token_loss", "next_token_logprobs", "logprobs_of", "kl_stats"):
        assert getattr(quality, name).__module__ == "soarpack.quant.quality"
        assert f"def {name}(" not in _source("quant/run.py")
    assert run.kl_stats is quality.kl_stats


@pytest.mark.needs_torch
def test_gla_backends_are_named_for_what_they_run():
    from soarpack.sala import gla

    assert gla._BACKENDS == ("torch", "fla") and gla.current_backend() == "torch"
    with pytest.raises(ValueError, match="torch"):
        gla.set_backend("auto")


@pytest.mark.needs_torch
def test_the_decoder_layer_keeps_no_attribute_nothing_reads():
    from soarpack.sala.config import SalaConfig
    from soarpack.sala.model import SalaDecoderLayer
    from soarpack.sala.tiny import tiny_config_dict

    layer = SalaDecoderLayer(SalaConfig.from_dict(tiny_config_dict(num_layers=2)), 0)
    assert not hasattr(layer, "mixer_type")


def test_record_flags_writes_the_table_lint_reads(sglang_fork_trees, tmp_path):
    """sglang/README.md's maintainer step: the recorded table is what the shipped one holds."""
    from soarpack.serve.patches import patch_dir
    from soarpack.serve.serverargs import FLAGS_FILE, builtin_flags, parse_server_args, record_flags

    out = record_flags(sglang_fork_trees["d29fb130c"], tmp_path / FLAGS_FILE, "test")
    recorded = json.loads(out.read_text(encoding="utf-8"))
    shipped = json.loads((patch_dir() / FLAGS_FILE).read_text(encoding="utf-8"))
    assert recorded["source"] == "test" and recorded["flags"] == shipped["flags"]
    assert parse_server_args(sglang_fork_trees["377b0b5eb"]) == builtin_flags()
