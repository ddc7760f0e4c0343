"""Recipes: what each built-in recipe quantizes, that its regexes read the same under HF and SGLang names,
and that recipes Marlin cannot serve are refused before any work."""

from __future__ import annotations

import re

import pytest

from soarpack.errors import ConfigError
from soarpack.recipe.model import list_recipes, load_recipe, recipe_from_dict
from soarpack.recipe.plan import FUSED_GROUPS, ModuleQuant, match_dynamic
from soarpack.sala.config import SalaConfig

SPARSE_IDS = [0, 9, 16, 17, 22, 29, 30, 31]


def real_config() -> SalaConfig:
    """The released MiniCPM-SALA shapes (SALA.md §3)."""
    return SalaConfig.from_dict({
        "model_type": "minicpm_sala", "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 73448,
        "lightning_nh": 32, "lightning_nkv": 32, "lightning_head_dim": 128,
        "mixer_types": ["minicpm4" if i in SPARSE_IDS else "lightning-attn" for i in range(32)],
        "sparse_config": {"dense_len": 8192},
    })


def fused_name(name: str) -> str:
    """SGLang's module name for an HF linear (the fork's substring replace)."""
    for fused, members in FUSED_GROUPS.items():
        for m in members:
            if name.endswith("." + m):
                return name[: -len(m)] + fused
    return name


def test_builtin_recipes_are_listed_and_serving_profiles_are_not(tmp_path, monkeypatch):
    names = list_recipes()
    assert {"w4-full", "w4-mlp", "w4-balanced", "w4-mlp-w8-attn"} <= set(names)
    import soarpack.recipe.files as recipe_files

    (tmp_path / "w4-x.toml").write_text('[quant]\nbits = 4\n')
    (tmp_path / "fp8.toml").write_text('recipe = "w4-mlp"\n[serve]\nargs = []\n')
    monkeypatch.setattr(recipe_files, "RECIPES_DIR", tmp_path)
    assert list_recipes() == ["w4-x"]
    with pytest.raises(ConfigError, match="serving profile"):
        load_recipe("fp8")


def test_w4_full_quantizes_every_decoder_linear():
    cfg = real_config()
    r = load_recipe("w4-full")
    plan = r.plan(cfg)
    assert len(plan) == 32 * 8
    assert all(mq == ModuleQuant(4, 128, True, False) for mq in plan.values())
    assert r.render_dynamic(cfg) == {}


def test_w4_mlp_keeps_all_attention_16bit():
    cfg = real_config()
    plan = load_recipe("w4-mlp").plan(cfg)
    for name, mq in plan.items():
        if ".mlp." in name:
            assert mq == ModuleQuant(4, 128, True, False), name
        else:
            assert mq is None, name
    # o_gate exists only in sparse layers, z_proj only in lightning ones: both are covered.
    assert plan["model.layers.0.self_attn.o_gate"] is None
    assert plan["model.layers.1.self_attn.z_proj"] is None


def test_w4_mlp_w8_attn_is_w4_mlp_with_every_attention_linear_at_w8():
    """fast-fp8's recipe: the MLP as w4-mlp quantizes it, and every attention linear a GPTQ-Marlin W8 one, so that
    patch 05 can give it an FP8 prefill route (a 16-bit linear never reaches gptq_marlin's apply)."""
    cfg = real_config()
    plan, mlp = load_recipe("w4-mlp-w8-attn").plan(cfg), load_recipe("w4-mlp").plan(cfg)
    assert plan.keys() == mlp.keys() and len(plan) == 32 * 8
    for name, mq in plan.items():
        if ".mlp." in name:
            assert mq == mlp[name] == ModuleQuant(4, 128, True, False), name
        else:
            assert mlp[name] is None and mq == ModuleQuant(8, 128, True, False), name
    assert plan["model.layers.0.self_attn.o_gate"].bits == plan["model.layers.1.self_attn.z_proj"].bits == 8


def test_w4_balanced_names_sparse_and_last_eight_lightning_attention():
    cfg = real_config()
    plan = load_recipe("w4-balanced").plan(cfg)
    # The release's Lightning layers are 1-8, 10-15, 18-21, 23-28; the last eight are written out by hand.
    w8_layers = set(SPARSE_IDS) | {20, 21, 23, 24, 25, 26, 27, 28}
    for name, mq in plan.items():
        layer = int(name.split(".")[2])
        expect = 8 if (".self_attn." in name and layer in w8_layers) else 4
        assert mq is not None and mq.bits == expect, name


@pytest.mark.parametrize("recipe", ["w4-full", "w4-mlp", "w4-balanced", "w4-mlp-w8-attn"])
def test_rendered_regexes_read_the_same_under_both_spellings(recipe):
    cfg = real_config()
    r = load_recipe(recipe)
    dyn = r.render_dynamic(cfg)
    for name in r.plan(cfg):
        assert match_dynamic(dyn, name) == match_dynamic(dyn, fused_name(name)), name
    # No regex may reach outside the decoder linears.
    for other in ("lm_head", "model.embed_tokens", "model.layers.1.self_attn.q_norm", "model.layers.10.mlp.gate_proj_x"):
        assert match_dynamic(dyn, other) is None


def test_layer_indices_do_not_leak_into_longer_numbers():
    cfg = real_config()
    r = recipe_from_dict({"quant": {"rules": [{"layers": [1], "modules": ["mlp"], "quantize": False}]}})
    dyn = r.render_dynamic(cfg)
    assert match_dynamic(dyn, "model.layers.1.mlp.down_proj") is False
    assert match_dynamic(dyn, "model.layers.11.mlp.down_proj") is None
    assert match_dynamic(dyn, "model.layers.1.mlp.gate_up_proj") is False
    key = next(iter(dyn))
    assert key.startswith("-:") and re.compile(key[2:])


@pytest.mark.parametrize("modules", [["q_proj"], ["q_proj", "k_proj"], ["gate_proj"], ["up_proj", "down_proj"]])
def test_splitting_fused_members_is_refused(modules):
    with pytest.raises(ConfigError, match="fused"):
        recipe_from_dict({"quant": {"rules": [{"modules": modules, "bits": 8}]}})


def test_fused_names_are_accepted_as_whole_groups():
    r = recipe_from_dict({"quant": {"rules": [{"modules": ["qkv_proj", "gate_up_proj"], "quantize": False}]}})
    plan = r.plan(real_config())
    assert plan["model.layers.3.self_attn.k_proj"] is None
    assert plan["model.layers.3.mlp.up_proj"] is None
    assert plan["model.layers.3.mlp.down_proj"] is not None


@pytest.mark.parametrize("quant, match", [
    ({"sym": False}, "symmetric"),
    ({"group_size": 1024}, "group_size"),
    ({"bits": 3}, "bits"),
    ({"damp": 0}, "damp"),
    ({"rules": [{"modules": ["mlp"], "group_size": 1024}]}, "group_size"),
    ({"rules": [{"modules": ["mlp"], "bits": 2}]}, "bits"),
    ({"rules": [{"modules": ["mlp"], "sym": False, "bits": 8}]}, "sym"),
    ({"rules": [{"modules": ["nope"], "bits": 8}]}, "unknown module"),
    ({"rules": [{"modules": ["mlp"]}]}, "changes nothing"),
    ({"typo": 1}, "unknown key"),
])
def test_settings_marlin_cannot_serve_are_refused(quant, match):
    with pytest.raises(ConfigError, match=match):
        recipe_from_dict({"quant": quant})


def test_shapes_marlin_cannot_serve_are_refused_for_a_config():
    d = dict(real_config().raw)
    d["intermediate_size"] = 16384 + 64  # out % 64 still holds for gate/up; down_proj in_features no longer a multiple of 128
    cfg = SalaConfig.from_dict(d)
    with pytest.raises(ConfigError, match="down_proj"):
        load_recipe("w4-full").validate_for(cfg)
    load_recipe("w4-full").validate_for(real_config())


def test_unknown_recipe_names_the_builtins():
    with pytest.raises(ConfigError, match="w4-mlp"):
        load_recipe("w5-nothing")


def test_recipe_file_by_path(tmp_path):
    p = tmp_path / "mine.toml"
    p.write_text('[quant]\nname = "mine"\nbits = 8\ngroup_size = 64\n')
    r = load_recipe(p)
    assert (r.name, r.bits, r.group_size, r.damp) == ("mine", 8, 64, 0.05)
    p.write_text("[quant\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_recipe(p)


def test_calibration_settings_come_from_the_cli_then_the_recipe_then_the_defaults(tmp_path):
    from soarpack.quant.options import CALIBRATION_DEFAULTS, CalibrationOverrides, resolve_calibration

    p = tmp_path / "cal.toml"
    p.write_text('[quant]\nname = "cal"\n\n[calibration]\nrows = 64\nseed = 7\n')
    settings, sources = resolve_calibration(CalibrationOverrides(rows=8), load_recipe(p).calibration)
    assert (settings.rows, settings.seed, settings.max_len) == (8, 7, CALIBRATION_DEFAULTS.max_len)
    assert sources == {"rows": "cli", "seed": "recipe", "max_len": "default", "batch": "default"}
    for bad in ("rows = 0", "rows = 64.0", "batch = true", "colour = 1"):
        p.write_text(f'[quant]\nname = "cal"\n\n[calibration]\n{bad}\n')
        with pytest.raises(ConfigError, match=re.escape(bad.split(" ")[0])):
            load_recipe(p)
