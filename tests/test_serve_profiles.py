"""Serving profiles: the packaged ones agree with their recipe and the patch set; the loader and the CLI."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.errors import ConfigError
from soarpack.serve.lint import errors, lint_args, lint_profile
from soarpack.serve.patches import list_patches
from soarpack.recipe.profile import DEFAULT_PROFILE, list_profiles, load_profile


def _flag(args, name):
    return args[args.index(name) + 1] if name in args else None


def test_packaged_profiles_lint_clean_with_their_patches():
    assert {"fp8", "fp8-kv", "fast-fp8", "safe", "dense-fp8"} <= set(list_profiles())
    assert DEFAULT_PROFILE == "fast-gla"  # issue 38: fast + patch 06, faster than fast run before and after it (§16)
    for name in list_profiles():
        prof = load_profile(name)
        assert set(prof.patches) <= set(list_patches()), name
        assert prof.fallback is None or prof.fallback in list_profiles(), name
        found = lint_args(prof.args, recipe=prof.recipe, patched=set(prof.patches))
        assert errors(found) == [], (name, found)
        assert [f.rule for f in found] == [], (name, found)  # not even a warning
        assert shlex.split(prof.args_string()) == prof.args


def test_profiles_say_what_the_issue_asks():
    fp8, safe, dense = load_profile("fp8-kv"), load_profile("safe"), load_profile("dense-fp8")
    for p in (fp8, safe, dense):
        assert p.recipe == "w4-mlp"
        assert (_flag(p.args, "--quantization"), _flag(p.args, "--dtype")) == ("gptq_marlin", "bfloat16")
        assert int(_flag(p.args, "--cuda-graph-max-bs")) >= 32
    assert _flag(fp8.args, "--kv-cache-dtype") == "fp8_e5m2" and _flag(fp8.args, "--attention-backend") == "minicpm_flashinfer"
    assert int(_flag(fp8.args, "--chunked-prefill-size")) > int(_flag(safe.args, "--chunked-prefill-size"))
    assert {"fp8-kv-query", "fp8-kv-compressed-keys"} <= set(fp8.patches) and fp8.fallback == "safe"
    assert _flag(safe.args, "--kv-cache-dtype") in (None, "auto") and safe.patches == []
    assert _flag(dense.args, "--kv-cache-dtype") == "fp8_e5m2" and "--force-dense-minicpm" in dense.args and dense.patches == []
    # without its patches the fp8-kv profile is refused: the lint knows the sparse fp8 path is broken unpatched
    assert "fp8-kv-sparse-unpatched" in {f.rule for f in errors(lint_profile("fp8-kv", patched=set()))}
    assert lint_profile("fp8-kv") == [] and lint_profile("safe", patched=set()) == []


def test_the_fp8_profiles_of_issue_37():
    """fp8: the fork's own W8A8 --quantization fp8 on the original checkpoint (recipe bf16, nothing quantized before,
    no patches); fast-fp8: "fast"'s args and patches plus patch fp8-prefill (which needs w4-dispatch), on recipe
    w4-mlp-w8-attn (every linear GPTQ-Marlin, so every one can take the FP8 route); both say their FP8 risk."""
    from soarpack.recipe.model import load_recipe

    fp8, fast_fp8, fast, safe = (load_profile(n) for n in ("fp8", "fast-fp8", "fast", "safe"))
    assert fp8.recipe == "bf16" and not load_recipe("bf16").quantizes and fp8.patches == [] and fp8.fallback is None
    assert fp8.args == [("fp8" if a == "gptq_marlin" else a) for a in safe.args]  # safe's args, --quantization fp8
    assert fast_fp8.recipe == "w4-mlp-w8-attn" and fast_fp8.patches == ["w4-dispatch", "fp8-prefill"]
    assert fast_fp8.args == fast.args and fast_fp8.fallback == "safe"
    assert "patch-requires" in {f.rule for f in lint_profile("fast-fp8", patched={"fp8-prefill"})}
    for prof in (fp8, fast_fp8):
        flagged = [e for e in prof.evidence if e.risk]
        assert flagged and all(e.kind == "none" for e in flagged), prof.name  # nothing measured on a GPU
        assert any("75-77.5" in e.risk and "unmeasured" in e.risk or "unknown" in e.risk for e in flagged)
        assert not any(e.relation == "this" and e.acc_ori is not None for e in prof.evidence)  # no accuracy claimed


def test_loader_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown serving profile 'turbo'"):
        load_profile("turbo")
    with pytest.raises(ConfigError, match="no \\[serve\\] table") as err:
        load_profile("w4-mlp")  # a quantization recipe, not a profile
    assert "quantization recipe" in err.value.message and "safe" in err.value.hint
    bad = tmp_path / "bad.toml"
    bad.write_text('recipe = "w4-mlp"\n[serve]\nargs = "--dtype bfloat16"\n')
    with pytest.raises(ConfigError, match="must be a list of strings"):
        load_profile(bad)
    bad.write_text('[serve]\nargs = []\nextra = 1\n')
    with pytest.raises(ConfigError, match="unknown key \\[serve\\].extra"):
        load_profile(bad)
    good = tmp_path / "mine.toml"
    good.write_text('recipe = "w4-full"\n[serve]\nargs = ["--dtype", "bfloat16"]\ndescription = """two\n  lines"""\n')
    prof = load_profile(good)
    assert (prof.name, prof.recipe, prof.args, prof.patches, prof.fallback, prof.description) == (
        "mine", "w4-full", ["--dtype", "bfloat16"], [], None, "two lines")


def test_cli_args_and_profiles(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["args"])
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == load_profile(DEFAULT_PROFILE).args_string()

    res = runner.invoke(app, ["args", "safe", "--json"])
    data = json.loads(res.stdout)
    assert data["name"] == "safe" and data["args_string"] == load_profile("safe").args_string() and data["findings"] == []

    res = runner.invoke(app, ["args", "fp8-kv", "--unpatched"])
    assert res.exit_code == 2 and "fp8-kv-sparse-unpatched" in res.output

    broken = tmp_path / "broken.toml"
    broken.write_text('[serve]\nargs = ["--attention-backend", "minicpm_flashinfer", "--disable_cuda_graph"]\n')
    res = runner.invoke(app, ["args", str(broken)])
    assert res.exit_code == 2
    assert "--disable_cuda_graph must be written --disable-cuda-graph" in res.output and "cuda-graph-disabled" in res.output

    res = runner.invoke(app, ["profiles", "--json"])
    assert [p["name"] for p in json.loads(res.stdout)] == list_profiles()
    res = runner.invoke(app, ["profiles"])
    assert "fast-gla (default)" in res.stdout and "fast (default)" not in res.stdout and "safe (default)" not in res.stdout
