"""soarpack.sala against the model's own HF code (golden logits), against naive references, and its config facts."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from soarpack.errors import CheckpointError, ConfigError
from soarpack.sala.checkpoint import load_model, read_state_dict, save_state_dict
from soarpack.sala.config import SalaConfig, alibi_slopes, load_config
from soarpack.sala.model import SparseAttention
from soarpack.sala.release import release_config_dict


@pytest.mark.parametrize("length", [63, 130, 200])
def test_matches_hf_reference_logits(golden_dir, length):
    model = load_model(golden_dir, dtype=torch.float32)
    cases = load_file(str(golden_dir / "cases.safetensors"))
    with torch.no_grad():
        logits = model(cases[f"input_ids_{length}"][None])[0]
    exact = cases[f"logits_naivegla_{length}"]
    assert (logits - exact).abs().max().item() < 2e-5  # measured ~8e-7
    assert (logits - cases[f"logits_{length}"]).abs().max().item() < 2e-3  # the GPU run has TF32 kernel noise


def test_decode_through_cache_matches_hf_reference(golden_dir):
    model = load_model(golden_dir, dtype=torch.float32)
    cases = load_file(str(golden_dir / "cases.safetensors"))
    cache = model.new_cache()
    with torch.no_grad():
        model(cases["input_ids_130"][None], cache=cache)
        steps = [model(t.view(1, 1), cache=cache)[0, -1] for t in cases["decode_input_ids_130"]]
    assert (torch.stack(steps) - cases["decode_logits_130"]).abs().max().item() < 2e-3  # measured 2.6e-4 (TF32)


def test_full_forward_equals_prefill_then_decode(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype=torch.float64)
    ids = torch.randint(0, 500, (2, 80), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache()
        pre = model(ids[:, :67], cache=cache)
        steps = [model(ids[:, t : t + 1], cache=cache) for t in range(67, 80)]
    torch.testing.assert_close(torch.cat([pre] + steps, 1), full, rtol=1e-9, atol=1e-9)


def test_sparse_attention_equals_naive_softmax_with_gqa():
    cfg = SalaConfig.from_dict({**release_config_dict(), "hidden_size": 64, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "head_dim": 16})
    torch.manual_seed(0)
    attn = SparseAttention(cfg).double()
    x = torch.randn(2, 9, 64, dtype=torch.float64)
    pos = torch.arange(9).expand(2, 9)
    out = attn(x, pos)
    q = attn.q_proj(x).view(2, 9, 4, 16)
    k = attn.k_proj(x).view(2, 9, 2, 16)
    v = attn.v_proj(x).view(2, 9, 2, 16)
    ref = torch.zeros(2, 9, 4, 16, dtype=torch.float64)
    for h in range(4):
        kv = h // 2  # query heads 0,1 share KV head 0; heads 2,3 share KV head 1
        scores = q[:, :, h] @ k[:, :, kv].transpose(1, 2) / math.sqrt(16)
        scores = scores.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), float("-inf"))
        ref[:, :, h] = scores.softmax(-1) @ v[:, :, kv]
    ref = ref.reshape(2, 9, 64) * torch.sigmoid(attn.o_gate(x))
    torch.testing.assert_close(out, attn.o_proj(ref), rtol=1e-10, atol=1e-10)


def test_padding_mask_leaves_real_tokens_unchanged(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype=torch.float64)
    ids = torch.randint(5, 500, (1, 20), generator=torch.Generator().manual_seed(1))
    padded = torch.cat([torch.full((1, 6), 2), ids], 1)  # left padding
    mask = torch.cat([torch.zeros(1, 6), torch.ones(1, 20)], 1).long()
    with torch.no_grad():
        torch.testing.assert_close(model(padded, attention_mask=mask)[:, 6:], model(ids), rtol=1e-9, atol=1e-9)


def test_release_config_facts():
    cfg = SalaConfig.from_dict(release_config_dict())
    assert cfg.sparse_layer_ids == [0, 9, 16, 17, 22, 29, 30, 31]
    assert len(cfg.lightning_layer_ids) == 24
    assert cfg.residual_scale == pytest.approx(1.4 / math.sqrt(32))
    assert cfg.residual_scale == pytest.approx(0.2475, abs=1e-4)
    assert cfg.logits_divisor == 16
    slopes = cfg.lightning_slopes
    assert slopes[0] == pytest.approx(2**-0.25) and slopes[31] == pytest.approx(2**-8)
    assert slopes == pytest.approx([2 ** (-0.25 * (h + 1)) for h in range(32)])
    assert cfg.dense_len == 8192
    params = sum(math.prod(s) for s in cfg.tensor_shapes().values())
    assert 9.4e9 < params < 9.6e9  # ≈ 9.48 B


def test_alibi_slopes_interleave_for_non_powers_of_two():
    assert alibi_slopes(6) == pytest.approx(alibi_slopes(4) + alibi_slopes(8)[0::2][:2])


def test_sharded_and_single_file_load_identically(tiny_model_dir, tmp_path):
    single = tmp_path / "single"
    shutil.copytree(tiny_model_dir, single, ignore=shutil.ignore_patterns("model*.safetensors*"))
    names = save_state_dict(read_state_dict(tiny_model_dir), single, max_shard_bytes=1 << 40)
    assert names == ["model.safetensors"]
    assert len(list(tiny_model_dir.glob("model-*.safetensors"))) > 1
    ids = torch.arange(40).view(1, 40)
    with torch.no_grad():
        a = load_model(tiny_model_dir, dtype=torch.float32)(ids)
        b = load_model(single, dtype=torch.float32)(ids)
    assert torch.equal(a, b)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_missing_shard_is_named(tiny_model_dir, tmp_path):
    ckpt = _copy(tiny_model_dir, tmp_path / "m")
    shard = sorted(ckpt.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=shard.name):
        load_model(ckpt)


def test_shape_mismatch_is_named(tiny_model_dir, tmp_path):
    ckpt = _copy(tiny_model_dir, tmp_path / "m")
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["intermediate_size"] = 768
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"mlp\.(down|gate|up)_proj\.weight has shape"):
        load_model(ckpt)


@pytest.mark.parametrize(
    "mutate, pattern",
    [
        (lambda c: c.update(mixer_types=c["mixer_types"][:-1]), r"'mixer_types' has 3 entries but num_hidden_layers is 4"),
        (lambda c: c["mixer_types"].__setitem__(2, "mamba"), r"'mixer_types'\[2\] is 'mamba'"),
        (lambda c: c["mixer_types"].__setitem__(0, "lightning-attn"), r"'mixer_types'\[0\] must be 'minicpm4'"),
        (lambda c: c.update(model_type="llama"), "model_type is 'llama'"),
        (lambda c: c.update(hidden_size="4096"), "'hidden_size' must be a positive integer"),
    ],
)
def test_bad_config_names_the_field(tiny_model_dir, tmp_path, mutate, pattern):
    ckpt = _copy(tiny_model_dir, tmp_path / "m")
    cfg = json.loads((ckpt / "config.json").read_text())
    mutate(cfg)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=pattern):
        load_config(ckpt)


def test_malformed_config_json_and_wrong_path(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "minicpm_sala",')
    with pytest.raises(ConfigError, match=r"not valid JSON: line 1"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope")


def test_load_keeps_bf16_and_builds_no_rope_table(tiny_model_dir):
    model = load_model(tiny_model_dir)  # default bf16
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert sum(b.numel() for b in model.buffers()) < 100  # only the per-head decays
