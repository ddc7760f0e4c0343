"""Every lint rule: one case that trips it, one that passes."""

from __future__ import annotations

import textwrap

import pytest

from soarpack.serve.lint import ERROR_RULES, RULES, Finding, lint_args, raise_on_errors, recipe_grid
from soarpack.serve.serverargs import builtin_flags, parse_server_args

FP8_PATCHES = {"fp8-kv-query", "fp8-kv-compressed-keys"}
BASE = "--quantization gptq_marlin --dtype bfloat16 --attention-backend minicpm_flashinfer --cuda-graph-max-bs 32"


def write_recipe(tmp_path, name, **quant):
    body = "\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in quant.items())
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[quant]\nname = "{name}"\n{body}\n')
    return path


# rule -> (tripping args, passing args, extra kwargs for both); recipes are set up in the test
CASES = {
    "underscore-flag": (f"{BASE} --chunked_prefill_size 8192", f"{BASE} --chunked-prefill-size 8192", {}),
    "not-a-flag": (f"{BASE} 8192", f"{BASE} --chunked-prefill-size 8192", {}),
    "unknown-flag": (f"{BASE} --enable-warp-drive", f"{BASE} --enable-metrics", {}),
    "missing-value": (f"{BASE} --chunked-prefill-size", f"{BASE} --chunked-prefill-size=8192", {}),
    "bad-choice": (f"{BASE} --kv-cache-dtype fp7", f"{BASE} --kv-cache-dtype bf16", {}),
    "duplicate-flag": (f"{BASE} --tensor-parallel-size 1 --tp-size 1", f"{BASE} --tp-size 1", {}),
    "gptq-needs-fp16": ("--quantization gptq --dtype bfloat16 --attention-backend minicpm_flashinfer", BASE, {}),
    "cuda-graph-disabled": (f"{BASE} --disable-cuda-graph", f"{BASE} --disable-radix-cache", {}),
    "fp8-kv-sparse-unpatched": (f"{BASE} --kv-cache-dtype fp8_e5m2", f"{BASE} --kv-cache-dtype fp8_e5m2", {"patched_ok": FP8_PATCHES}),
    "fp8-kv-pool-uncapped": (f"{BASE} --kv-cache-dtype fp8_e5m2", f"{BASE} --kv-cache-dtype fp8_e5m2 --max-total-tokens 4194304",
                             {"patched": FP8_PATCHES}),
    "fp8-kv-flashattn": ("--quantization gptq_marlin --dtype bfloat16 --attention-backend minicpm_flashattn --kv-cache-dtype fp8_e5m2",
                         f"{BASE} --kv-cache-dtype fp8_e5m2 --max-total-tokens 4194304", {"patched": FP8_PATCHES}),
    "fp16-sparse-unpatched": ("--quantization gptq_marlin --dtype float16 --attention-backend minicpm_flashinfer",
                              "--quantization gptq_marlin --dtype float16 --attention-backend minicpm_flashinfer", {"patched_ok": {"sparse-dtype"}}),
    "fp16-accuracy": ("--quantization gptq_marlin --dtype half --attention-backend flashinfer", BASE, {}),
    "marlin-asym-recipe": (BASE, BASE, {"recipe_bad": dict(bits=4, group_size=128, sym=False, desc_act=False)}),
    "marlin-grid": (BASE, BASE, {"recipe_bad": dict(bits=3, group_size=128, sym=True, desc_act=False)}),
    "marlin-desc-act": (BASE, BASE, {"recipe_bad": dict(bits=4, group_size=128, sym=True, desc_act=True)}),
    "no-quantization": ("--dtype bfloat16 --attention-backend minicpm_flashinfer", BASE, {"recipe": "w4-mlp"}),
    "force-dense-sparse-backend": ("--quantization gptq_marlin --attention-backend minicpm_flashinfer --force-dense-minicpm",
                                   "--quantization gptq_marlin --attention-backend flashinfer --force-dense-minicpm", {}),
    "dense-as-sparse-ignored": ("--quantization gptq_marlin --attention-backend flashinfer --force-dense-minicpm --dense-as-sparse",
                                f"{BASE} --dense-as-sparse", {}),
    "no-attention-backend": ("--quantization gptq_marlin --dtype bfloat16", BASE, {}),
    "cuda-graph-bs": (BASE.replace("--cuda-graph-max-bs 32", "--cuda-graph-max-bs 8"), BASE, {}),
    "platform-override": (f"{BASE} --max-running-requests 16", f"{BASE} --max-prefill-tokens 16384", {}),
    "platform-flag-wins": (f"{BASE} --port 8000", f"{BASE} --max-prefill-tokens 16384", {}),
    "mem-fraction-range": (f"{BASE} --mem-fraction-static 7", f"{BASE} --mem-fraction-static 0.85", {}),
    "unknown-patch": (BASE, BASE, {"patched": {"fp9-kv"}, "patched_ok": {"fp8-kv-query"}}),
    "patch-requires": (BASE, BASE, {"patched": {"fp8-prefill"}, "patched_ok": {"w4-dispatch", "fp8-prefill"}}),
    "unsafe-token": (f'{BASE} --served-model-name "my model"', f"{BASE} --served-model-name my-model", {}),
    "quantization-recipe": (BASE.replace("gptq_marlin", "fp8"), BASE, {"recipe": "w4-mlp"}),
}


def test_quantization_recipe_both_ways():
    """An unquantized recipe (method none) wants --quantization fp8 or none, never a GPTQ method; a GPTQ recipe wants
    a GPTQ method, never fp8."""
    fp8 = BASE.replace("gptq_marlin", "fp8")
    none = BASE.replace("--quantization gptq_marlin ", "")
    assert "quantization-recipe" in {f.rule for f in lint_args(BASE, recipe="bf16")}
    assert [f.rule for f in lint_args(fp8, recipe="bf16")] == []
    assert [f.rule for f in lint_args(none, recipe="bf16")] == []  # plain bf16 serving: no no-quantization finding
    assert "quantization-recipe" in {f.rule for f in lint_args(fp8, recipe="w4-mlp")}


def test_every_rule_has_a_case():
    assert set(CASES) == set(RULES)
    assert ERROR_RULES <= set(RULES)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_trips_and_passes(rule, tmp_path):
    bad, good, extra = CASES[rule]
    kw_bad, kw_good = {}, {}
    if "recipe_bad" in extra:
        kw_bad["recipe"] = write_recipe(tmp_path, "bad", **extra["recipe_bad"])
        kw_good["recipe"] = write_recipe(tmp_path, "good", bits=4, group_size=128, sym=True, desc_act=False)
    if "recipe" in extra:
        kw_bad["recipe"] = kw_good["recipe"] = extra["recipe"]
    if "patched" in extra:
        kw_bad["patched"] = extra["patched"]
        kw_good["patched"] = extra.get("patched_ok", extra["patched"])
    elif "patched_ok" in extra:
        kw_good["patched"] = extra["patched_ok"]

    tripped = [f for f in lint_args(bad, **kw_bad) if f.rule == rule]
    assert tripped, f"{rule} did not trip on {bad!r}"
    assert all(f.level == ("error" if rule in ERROR_RULES else "warning") for f in tripped)
    passed = lint_args(good, **kw_good)
    assert rule not in {f.rule for f in passed}, f"{rule} tripped on {good!r}: {passed}"


def test_list_and_string_forms_agree():
    args = BASE + " --kv-cache-dtype fp8_e5m2 --disable-cuda-graph"
    assert lint_args(args) == lint_args(args.split())


def test_error_messages_name_the_fix():
    (f,) = [f for f in lint_args(f"{BASE} --max_running_requests 8") if f.rule == "underscore-flag"]
    assert f.message == "--max_running_requests must be written --max-running-requests"
    with pytest.raises(Exception) as err:
        raise_on_errors(lint_args(f"{BASE} --disable-cuda-graph"), "profile x")
    assert "cuda-graph-disabled" in str(err.value) and "profile x" in str(err.value)
    assert str(Finding("error", "r", "m")) == "error r: m"


def test_flags_parsed_from_a_server_args_py(tmp_path):
    src = tmp_path / "python" / "sglang" / "srt"
    src.mkdir(parents=True)
    (src / "server_args.py").write_text(textwrap.dedent('''
        DTYPES = ["auto", "bfloat16"]
        class ServerArgs:
            @staticmethod
            def add_cli_args(parser):
                parser.add_argument("--dtype", type=str, choices=DTYPES)
                parser.add_argument("--tp-size", "--tensor-parallel-size", type=int)
                parser.add_argument("--new-knob", action="store_true")
                parser.add_argument("--old-knob", action=DeprecatedAction, nargs=0)
    '''))
    flags = parse_server_args(tmp_path / "python")
    assert flags["--dtype"].choices == ("auto", "bfloat16") and flags["--dtype"].takes_value
    assert flags["--tensor-parallel-size"].canonical == "--tp-size"
    assert not flags["--new-knob"].takes_value and not flags["--old-knob"].takes_value
    # --new-knob is known to this tree but not to the recorded fork table, and the other way round
    assert "unknown-flag" not in {f.rule for f in lint_args("--new-knob --dtype bfloat16", server_args_py=tmp_path / "python")}
    assert "unknown-flag" in {f.rule for f in lint_args("--new-knob", server_args_py=None)}
    assert "unknown-flag" in {f.rule for f in lint_args("--enable-metrics", server_args_py=tmp_path / "python")}


def test_builtin_table_knows_the_fork_flags():
    flags = builtin_flags()
    for name in ("--dense-as-sparse", "--force-dense-minicpm", "--fuse-topk", "--kv-cache-dtype", "--cuda-graph-max-bs"):
        assert name in flags
    assert "fp8_e5m2" in flags["--kv-cache-dtype"].choices and "gptq_marlin" in flags["--quantization"].choices


def test_recipe_grid_reads_an_asymmetric_recipe_the_loader_refuses(tmp_path):
    grid = recipe_grid(write_recipe(tmp_path, "asym", bits=4, group_size=128, sym=False, desc_act=False))
    assert (grid.name, grid.sym) == ("asym", False)
    assert recipe_grid("w4-mlp").sym is True
