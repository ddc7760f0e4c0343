"""The recipe and the profile as typed models (soarpack.recipe): one resolver for names and paths, unknown keys
named with the nearest known one, evidence carried, each default stated once, and the quantization_config pair that
lets a checkpoint carry its recipe."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from soarpack.errors import ConfigError
from soarpack.evidence import Evidence
from soarpack.recipe import files
from soarpack.recipe.checkpoint import base_grid, quantization_config, recipe_for, recipe_of_checkpoint
from soarpack.recipe.model import Recipe, list_recipes, load_recipe, recipe_from_dict, recipe_from_text, render_toml
from soarpack.recipe.profile import Profile, list_profiles, load_profile
from soarpack.sala.config import SalaConfig

SAFE_ARGS = ["--quantization", "gptq_marlin", "--dtype", "bfloat16", "--attention-backend", "minicpm_flashinfer",
             "--cuda-graph-max-bs", "32"]


def tiny_config() -> SalaConfig:
    """Four layers, the first sparse (soarpack.sala.tiny's shapes, without importing torch)."""
    return SalaConfig.from_dict({
        "model_type": "minicpm_sala", "hidden_size": 256, "intermediate_size": 640, "num_hidden_layers": 4,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 512,
        "lightning_nh": 2, "lightning_nkv": 2, "lightning_head_dim": 128,
        "mixer_types": ["minicpm4", "lightning-attn", "lightning-attn", "lightning-attn"],
        "sparse_config": {"dense_len": 8192},
    })


# -- names resolve one way ----------------------------------------------------------------------------------------


def test_a_file_or_folder_named_like_a_builtin_never_shadows_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("w4-mlp").write_text('[quant]\nname = "impostor"\nbits = 8\n')
    Path("safe").mkdir()  # a folder of that name broke every default build before
    Path("fast-gla").mkdir()  # the default profile's name since issue 38
    Path("w4-full").mkdir()
    rec = load_recipe("w4-mlp")
    assert rec.name == "w4-mlp" and rec.bits == Recipe.model_fields["bits"].default
    assert load_profile("safe").name == "safe"
    assert load_recipe("./w4-mlp").name == "impostor"  # a `/`: the file
    Path("mine.toml").write_text("[quant]\n")
    assert load_recipe("mine.toml").name == "mine"  # `.toml`: the file
    with pytest.raises(ConfigError, match="no recipe named 'mine'") as err:
        load_recipe("mine")  # neither: a built-in name, and there is none
    assert "built-in recipes: " in err.value.hint
    Path("other").write_text("[quant]\n")
    with pytest.raises(ConfigError, match="no recipe named 'other'") as err:
        load_recipe("other")
    assert "pass ./other" in err.value.hint
    with pytest.raises(ConfigError, match="is a directory"):
        load_recipe("./safe")
    assert load_recipe("w4-full").name == "w4-full"
    from soarpack.bundle.build import build_bundle

    built = build_bundle(None, wheels=False)  # the default build, beside both impostors
    assert built.manifest["profile"]["name"] == "fast-gla"  # the default profile (issue 38), not the impostor folder
    assert (built.manifest["quantize"]["recipe"], built.manifest["quantize"]["recipe_name"]) == ("w4-mlp", "w4-mlp")


def test_recipe_and_profile_share_the_one_rule():
    for arg, is_path in (("w4-mlp", False), ("./w4-mlp", True), ("x.toml", True), ("a/b", True), ("safe", False)):
        assert files.is_path(arg) is is_path, arg
    assert files.locate("w4-mlp", "recipe").builtin == "w4-mlp"
    assert files.locate("safe", "profile").builtin == "safe"
    with pytest.raises(ConfigError, match="serving profile, not a recipe"):
        load_recipe("safe")
    with pytest.raises(ConfigError, match="quantization recipe, not a serving profile"):
        load_profile("w4-mlp")


# -- unknown keys are errors, naming the nearest known key --------------------------------------------------------


@pytest.mark.parametrize("text, where, guess", [
    ("[quant]\n[calibraton]\nrows = 8\n", "table [calibraton]", "calibration"),
    ("[quant]\nbitz = 4\n", "key [quant].bitz", "bits"),
    ("[quant]\n[[quant.rules]]\nlayer = 'all'\nmodules = ['mlp']\nbits = 8\n", "key [[quant.rules]].layer", "layers"),
    ("[quant]\n[calibration]\nrow = 8\n", "key [calibration].row", "rows"),
    ("[quant]\n[[evidence]]\nkind = 'none'\nsource = 's'\nsumary = 'x'\n", "key [[evidence]].sumary", "summary"),
])
def test_unknown_recipe_keys_name_the_nearest_known_key(tmp_path, text, where, guess):
    p = tmp_path / "r.toml"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_recipe(p)
    assert f"unknown {where}" in err.value.message
    assert f"did you mean {guess}?" in err.value.hint


def test_a_quant_key_at_the_top_level_is_told_where_it_belongs(tmp_path):
    p = tmp_path / "r.toml"
    p.write_text("bits = 8\n[quant]\n")
    with pytest.raises(ConfigError, match="unknown key bits") as err:
        load_recipe(p)
    assert err.value.hint == "it belongs in [quant].bits"


def test_unknown_profile_keys_are_errors_and_a_misplaced_fallback_is_told_where(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('recipe = "w4-mlp"\nfallback = "safe"\n[serve]\nargs = []\n')
    with pytest.raises(ConfigError, match="unknown key fallback") as err:
        load_profile(p)
    assert err.value.hint == "it belongs in [serve].fallback"
    p.write_text('recipe = "w4-mlp"\n[serve]\nargs = []\npatchs = []\n')
    with pytest.raises(ConfigError, match=r"unknown key \[serve\]\.patchs") as err:
        load_profile(p)
    assert "did you mean patches?" in err.value.hint
    p.write_text('recipe = "w4-mlp"\n[serv]\nargs = []\n')
    with pytest.raises(ConfigError, match=r"unknown table \[serv\]") as err:
        load_profile(p)
    assert "did you mean serve?" in err.value.hint


# -- evidence -----------------------------------------------------------------------------------------------------


def test_evidence_tables_are_read_and_validated(tmp_path):
    p = tmp_path / "r.toml"
    p.write_text('[quant]\n[[evidence]]\nkind = "none"\nsource = "docs/x.md"\nsummary = "nothing measured"\n')
    assert load_recipe(p).evidence == [Evidence(kind="none", source="docs/x.md", summary="nothing measured")]
    p.write_text('[quant]\n[[evidence]]\nkind = "rumour"\nsource = "s"\nsummary = "x"\n')
    with pytest.raises(ConfigError, match="evidence 1: kind = 'rumour'"):
        load_recipe(p)
    prof = tmp_path / "p.toml"
    prof.write_text('[serve]\nargs = []\n[[evidence]]\nkind = "platform"\nsource = "s"\nsummary = "x"\nacc_ori = 82.18\n')
    assert load_profile(prof).evidence[0].acc_ori == 82.18
    prof.write_text('[serve]\nargs = []\n[[evidence]]\nkind = "platform"\nsource = "s"\n')
    with pytest.raises(ConfigError, match="summary = missing"):
        load_profile(prof)
    for name in list_recipes():
        assert all(isinstance(e, Evidence) for e in load_recipe(name).evidence)
    for name in list_profiles():
        assert all(isinstance(e, Evidence) for e in load_profile(name).evidence)


# -- each default stated once -------------------------------------------------------------------------------------


def test_builtin_recipes_state_only_what_differs_from_the_defaults():
    from soarpack import _toml
    from soarpack.recipe.calibration import CALIBRATION_DEFAULTS

    for name in list_recipes():
        data = _toml.loads((files.RECIPES_DIR / f"{name}.toml").read_text(encoding="utf-8"))
        restated = [k for k, v in data["quant"].items() if k in Recipe.model_fields
                    and Recipe.model_fields[k].default == v]
        assert restated == [] and data["quant"].get("name", name) == name and "name" not in data["quant"], name
        calib = data.get("calibration", {})
        assert [k for k, v in calib.items() if getattr(CALIBRATION_DEFAULTS, k) == v] == [], name


@contextlib.contextmanager
def changed_default(field: str, value):
    """The Recipe model with one default changed, for as long as the block lasts."""
    info = Recipe.model_fields[field]
    before = info.default
    info.default = value
    Recipe.model_rebuild(force=True)
    try:
        yield
    finally:
        info.default = before
        Recipe.model_rebuild(force=True)


def _rtn_checkpoint(model_dir: Path, out: Path, recipe: Recipe) -> Path:
    """`recipe` applied by round-to-nearest (no GPTQModel), written the way quantize writes a checkpoint."""
    import torch

    from soarpack.quant.finalize import collect_tensors, copy_side_files, write_config
    from soarpack.quant.gptq_format import pack_cols, pack_rows
    from soarpack.sala.checkpoint import iter_tensors, save_state_dict
    from soarpack.sala.config import load_config

    config = load_config(model_dir)
    weights = dict(iter_tensors(model_dir))
    packed = {}
    for name, mq in recipe.plan(config).items():
        if mq is None:
            continue
        w = weights[f"{name}.weight"].to(torch.float32).t()  # [in, out]
        half = 1 << (mq.bits - 1)
        groups = w.reshape(w.shape[0] // mq.group_size, mq.group_size, w.shape[1])
        scales = (groups.abs().amax(dim=1) / (half - 1)).clamp_min(1e-6).to(torch.float16)
        g_idx = torch.arange(w.shape[0], dtype=torch.int32) // mq.group_size
        q = torch.clamp(torch.round(w / scales.to(torch.float32)[g_idx.long()]) + half, 0, (1 << mq.bits) - 1)
        zeros = torch.full(scales.shape, half - 1, dtype=torch.int32)
        packed[name] = {"qweight": pack_rows(q.to(torch.int32), mq.bits), "qzeros": pack_cols(zeros, mq.bits),
                        "scales": scales, "g_idx": g_idx}
    out.mkdir()
    save_state_dict(collect_tensors(packed, weights.items()), out)
    write_config(model_dir, out, quantization_config(recipe, config, ["soarpack:test", "rtn"]))
    copy_side_files(model_dir, out)
    return out


def _strip_from_quantization_config(ckpt: Path, key: str) -> None:
    for name in ("config.json", "quantize_config.json"):
        raw = json.loads((ckpt / name).read_text())
        (raw.get("quantization_config", raw)).pop(key)
        (ckpt / name).write_text(json.dumps(raw, indent=2))


@pytest.mark.needs_torch
def test_a_default_changed_on_the_model_moves_lint_verify_and_the_report(tmp_path, tiny_model_dir):
    """Each reader of a recipe reads the model: none keeps a copy of a default."""
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import Lines, check_inputs, module_bits
    from soarpack.quant.verify import verify_report
    from soarpack.serve.lint import lint_args

    mine = tmp_path / "mine.toml"
    mine.write_text('[quant]\ndescription = "states nothing: every setting is a default"\n')
    lines = []

    def report_lines(out: Path) -> dict:
        log = Lines(lambda e: lines.append(e.message))
        run = check_inputs(tiny_model_dir, out, [tiny_model_dir], quantize_options(recipe=str(mine), device="cpu"), log)
        return module_bits(run)

    with changed_default("desc_act", True):
        assert "marlin-desc-act" in {f.rule for f in lint_args(SAFE_ARGS, recipe=mine)}
        report_lines(tmp_path / "out1")
        assert "desc_act=True" in lines[-1]
    assert "marlin-desc-act" not in {f.rule for f in lint_args(SAFE_ARGS, recipe=mine)}
    report_lines(tmp_path / "out2")
    assert "desc_act=False" in lines[-1]

    with changed_default("group_size", 64):
        assert set(report_lines(tmp_path / "out3").values()) == {"4-bit g64"}
        ckpt = _rtn_checkpoint(tiny_model_dir, tmp_path / "g64", load_recipe(mine))
        assert json.loads((ckpt / "config.json").read_text())["quantization_config"]["group_size"] == 64
        _strip_from_quantization_config(ckpt, "group_size")  # now only the model's default says 64
        assert base_grid({}).group_size == 64
        problems = [p for p in verify_report(ckpt).problems if p.where != "quantization_config.group_size"]
        assert problems == []
    problems = verify_report(ckpt).problems  # the default is 128 again: the g64 tensors no longer fit
    assert any(p.code == "shape" and "for 4-bit g128" in p.message for p in problems)


# -- the quantization_config pair: the checkpoint carries its recipe ----------------------------------------------


def test_a_checkpoint_carries_its_recipe_so_no_file_is_needed_to_judge_it(tmp_path):
    config = tiny_config()
    mine = tmp_path / "mine.toml"
    mine.write_text('[quant]\nname = "mine"\ngroup_size = 64\n\n[[quant.rules]]\nlayers = [1]\nmodules = ["mlp"]\n'
                    'quantize = false\n')
    qc = quantization_config(load_recipe(mine), config, ["soarpack:test"])
    mine.unlink()  # the user's file is gone; the checkpoint still knows
    back = recipe_of_checkpoint(json.loads(json.dumps(qc)))
    assert back.name == "mine" and back.group_size == 64 and back.plan(config) == load_recipe_from(qc).plan(config)
    assert qc["meta"]["recipe_toml"].startswith("[quant]") and len(qc["meta"]["recipe_sha256"]) == 64
    assert recipe_for(qc, "w4-full").name == "w4-full"  # a recipe given wins

    qc["meta"]["recipe_toml"] += "\n# edited\n"
    with pytest.raises(ConfigError, match="does not match its meta.recipe_sha256"):
        recipe_of_checkpoint(qc)


def load_recipe_from(qc: dict) -> Recipe:
    return recipe_from_text(qc["meta"]["recipe_toml"], default_name="x", source="t")


def test_checkpoints_written_before_the_recipe_text_still_read_or_say_what_to_do():
    assert recipe_of_checkpoint({"meta": {"recipe": "w4-mlp"}}).name == "w4-mlp"
    with pytest.raises(ConfigError, match="names recipe 'mine', which is not a built-in") as err:
        recipe_of_checkpoint({"meta": {"recipe": "mine"}})
    assert "--recipe FILE" in err.value.hint
    with pytest.raises(ConfigError, match="names no recipe"):
        recipe_of_checkpoint({})
    with pytest.raises(ConfigError, match="not a built-in"):  # a checkpoint never makes us read a local file
        recipe_of_checkpoint({"meta": {"recipe": "./w4-mlp.toml"}})


def test_a_recipe_built_in_code_renders_to_toml_that_reads_back_the_same():
    rec = recipe_from_dict({"quant": {"name": "code", "bits": 8, "rules": [
        {"layers": "lightning", "last": 2, "modules": ["attn"], "bits": 4, "note": 'a "quoted" note'},
        {"layers": [0, 3], "modules": ["gate_up_proj"], "quantize": False}]},
        "calibration": {"rows": 32},
        "evidence": [{"kind": "none", "source": "here", "summary": "nothing measured"}]})
    assert rec.text is None
    back = recipe_from_text(render_toml(rec), default_name="x", source="rendered")
    assert back.model_dump(exclude={"text", "source"}) == rec.model_dump(exclude={"text", "source"})
    assert rec.sha256() == back.sha256() or back.text == render_toml(rec)


def test_the_default_recipe_is_the_default_profiles():
    from soarpack.quant.options import QuantizeOptions
    from soarpack.recipe.model import DEFAULT_RECIPE
    from soarpack.recipe.profile import DEFAULT_PROFILE

    assert load_profile(DEFAULT_PROFILE).recipe == DEFAULT_RECIPE == QuantizeOptions().recipe


def test_a_profile_is_a_model_and_its_dict_is_what_the_manifest_records():
    prof = load_profile("safe")
    assert isinstance(prof, Profile) and prof.recipe in list_recipes()
    d = prof.to_dict()
    assert d["args_string"] == prof.args_string() and d["name"] == "safe" and os.path.basename(d["source"]) == "safe.toml"
