"""The tiny-model factory: exact HF layout, deterministic, loadable, tokenizer with the real template's shape."""

import hashlib
import json

import torch
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.sala.checkpoint import load_model
from soarpack.sala.config import load_config
from soarpack.sala.tiny import make_tiny_model
from soarpack.sala.tokenizer import load_tokenizer


def _digest(folder):
    h = hashlib.sha256()
    for p in sorted(folder.iterdir()):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def test_layout(tiny_model_dir):
    names = {p.name for p in tiny_model_dir.iterdir()}
    for required in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "model.safetensors.index.json", "configuration_minicpm_sala.py", "modeling_minicpm_sala.py"):
        assert required in names
    assert len([n for n in names if n.startswith("model-") and n.endswith(".safetensors")]) >= 2
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    assert cfg["auto_map"]["AutoModelForCausalLM"].startswith("modeling_minicpm_sala.")
    assert "PLACEHOLDER" in (tiny_model_dir / "modeling_minicpm_sala.py").read_text()
    assert set(cfg["mixer_types"]) == {"minicpm4", "lightning-attn"}
    assert not any(p.name.startswith(".") for p in tiny_model_dir.parent.iterdir())  # no temp dir left behind


def test_deterministic_for_a_seed(tmp_path):
    a = make_tiny_model(tmp_path / "a", seed=3)
    b = make_tiny_model(tmp_path / "b", seed=3)
    c = make_tiny_model(tmp_path / "c", seed=4)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)


def test_tokenizer_and_chat_template(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    gen = json.loads((tiny_model_dir / "generation_config.json").read_text())
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert gen["eos_token_id"] == [2, im_end]
    text = tok.apply_chat_template([{"role": "user", "content": "where is the needle"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nwhere is the needle<|im_end|>\n<|im_start|>assistant\n"
    no_think = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = tok.encode("apple river")
    assert ids[0] == 1 and tok.decode(ids, skip_special_tokens=True) == "apple river"


def test_cli_pattern_and_errors(tmp_path):
    runner = CliRunner()
    out = tmp_path / "m"
    result = runner.invoke(app, ["tiny-model", str(out), "--pattern", "SLSLL"])
    assert result.exit_code == 0, result.output
    assert load_config(out).mixer_types == ("minicpm4", "lightning-attn", "minicpm4", "lightning-attn", "lightning-attn")
    again = runner.invoke(app, ["tiny-model", str(out)])
    assert again.exit_code == 2 and "not empty" in again.output
    bad = runner.invoke(app, ["tiny-model", str(tmp_path / "x"), "--pattern", "SXL"])
    assert bad.exit_code == 2 and "S and L" in bad.output
    model = load_model(out)
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 512)


def test_version_and_help():
    runner = CliRunner()
    assert runner.invoke(app, ["--version"]).output.startswith("soarpack ")
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "tiny-model" in result.output


def test_every_tokenizer_loader_gives_the_same_tokens(tiny_model_dir, tmp_path):
    from soarpack.measure.tokenizer import load_tokenizer as bench_loader
    from soarpack.errors import InputDataError

    text = "the needle is in the seventh castle"
    ids = load_tokenizer(tiny_model_dir).encode(text)
    # the bench reads the tokenizer files as data unless asked for remote code (--trust-remote-code, as
    # bench_serving); asked, the tiny model's placeholder refuses, and the same files load without it
    assert bench_loader(tiny_model_dir).encode(text) == ids
    assert bench_loader(tiny_model_dir, trust_remote_code=True).encode(text) == ids
    import pytest

    (tmp_path / "empty").mkdir()
    with pytest.raises(InputDataError, match="no tokenizer.json"):
        load_tokenizer(tmp_path / "empty")
