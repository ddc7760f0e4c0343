"""`soarpack serve-check`: our checkpoints loaded through the real OpenBMB fork (both commits) on a CPU.

The loader runs in a child interpreter, by default the image stand-in (CPython 3.10, torch 2.9.1, transformers
4.57.1). Under CI=true nothing here skips for lack of it: the stand-in is built (or the test fails).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from soarpack.cli import app
from soarpack.errors import CheckpointError, ConfigError
from soarpack.serve import forkcheck as F
from soarpack.serve.patches import apply_patches

RECIPES = ("w4-mlp", "w4-full", "w4-balanced", "w4-mlp-w8-attn")
FAST = dict(rows=16, max_len=128, seed=0, device="cpu", quality=False)
IN_CI = os.environ.get("CI") == "true"


@pytest.fixture(scope="session")
def image_python():
    from soarpack.imagestack import ImageStackError, ensure_image_stack

    try:
        return ensure_image_stack().python
    except ImageStackError as exc:
        if IN_CI:
            raise
        pytest.skip(f"not run: the image stand-in is not available here ({exc})")


@pytest.fixture(scope="session")
def patched_trees(sglang_fork_trees, tmp_path_factory):
    """Both commits with our patch set applied: what a bundle ships, so the patched modules must import."""
    out = {}
    for commit, src in sglang_fork_trees.items():
        out[commit] = tmp_path_factory.mktemp(f"patched-{commit}") / "python"
        apply_patches(src, out[commit])
    return out


@pytest.fixture(scope="session")
def quantized(tmp_path_factory):
    """{recipe: checkpoint} of one tiny SALA model, quantized once per session per recipe (CPU-heavy)."""
    pytest.importorskip("gptqmodel")
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize
    from soarpack.sala.tiny import make_tiny_model

    work = tmp_path_factory.mktemp("forkcheck")
    tiny = make_tiny_model(work / "tiny", num_layers=4)
    out = {}
    for recipe in RECIPES:
        out[recipe] = work / recipe
        quantize(tiny, out[recipe], quantize_options(recipe=recipe, **FAST))
    return out


def _copy(ckpt: Path, dest: Path) -> Path:
    shutil.copytree(ckpt, dest)
    return dest


def _rewrite_tensors(ckpt: Path, edit) -> None:
    """Apply `edit(state_dict)` to the checkpoint's tensors and rewrite its shards and index."""
    from soarpack.sala.checkpoint import read_state_dict, save_state_dict

    state = read_state_dict(ckpt)
    edit(state)
    for old in list(ckpt.glob("*.safetensors")) + list(ckpt.glob("*.safetensors.index.json")):
        old.unlink()
    save_state_dict(state, ckpt)


# -- against the real fork ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.gptq
@pytest.mark.parametrize("commit", ["377b0b5eb", "d29fb130c"])
@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_loads_through_the_fork(quantized, patched_trees, image_python, commit, recipe):
    result = F.run_fork_check(quantized[recipe], patched_trees[commit], python=image_python)
    print(result.table, result.summary, sep="\n")
    assert result.ok, result.problems
    report = result.report
    assert report["versions"]["python"].startswith("3.10.") and report["versions"]["torch"].startswith("2.9.1")
    assert report["config_class"] == "MiniCPMHybridConfig" and report["quant_config_class"] == "GPTQMarlinConfig"
    assert report["orphans"] == [] and report["unwritten"] == [] and report["tensors_loaded"] > 0
    assert {m["file"].startswith(str(patched_trees[commit].resolve())) for m in report["patched_modules"]} == {True}
    assert len(report["patched_modules"]) == len(F.patched_files())
    assert f"fork {commit} (patched)" in result.summary
    methods = {(r.module.rsplit(".", 1)[-1], r.method, r.bits) for r in result.rows}
    if recipe == "w4-mlp":
        assert ("qkv_proj", "UnquantizedLinearMethod", None) in methods
        assert not any(m == "GPTQMarlinLinearMethod" for name, m, _ in methods if name in ("qkv_proj", "o_proj"))
    if recipe == "w4-balanced":  # sparse layers' attention at W8 (layer 0 is sparse)
        layer0 = {r.module: r for r in result.rows if r.module.startswith("model.layers.0.self_attn.")}
        assert {(r.method, r.bits) for r in layer0.values()} == {("GPTQMarlinLinearMethod", 8)}
    if recipe == "w4-full":
        assert {(r.method, r.bits) for r in result.rows} == {("GPTQMarlinLinearMethod", 4)}
    if recipe == "w4-mlp-w8-attn":  # fast-fp8's: every linear GPTQ-Marlin, attention at W8, the MLP at W4
        kinds = {(".self_attn." in r.module, r.method, r.bits) for r in result.rows}
        assert kinds == {(True, "GPTQMarlinLinearMethod", 8), (False, "GPTQMarlinLinearMethod", 4)}, kinds


@pytest.mark.slow
@pytest.mark.gptq
def test_serve_check_needs_no_recipe_for_a_checkpoint_quantized_from_a_recipe_file(patched_trees, image_python,
                                                                                  tmp_path):
    """The checkpoint carries its recipe (TOML text and sha256): the user's file may be long gone."""
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize
    from soarpack.sala.tiny import make_tiny_model

    mine = tmp_path / "mine.toml"
    mine.write_text('[quant]\nname = "mine"\n\n[[quant.rules]]\nlayers = "lightning"\nmodules = ["attn"]\n'
                    'quantize = false\n')
    ckpt = tmp_path / "q"
    quantize(make_tiny_model(tmp_path / "tiny", num_layers=4), ckpt, quantize_options(recipe=str(mine), **FAST))
    mine.unlink()
    result = F.run_fork_check(ckpt, patched_trees["d29fb130c"], python=image_python)
    assert result.ok, result.problems
    assert "recipe mine:" in result.summary
    res = CliRunner().invoke(app, ["serve-check", str(ckpt), "--sglang-src", str(patched_trees["d29fb130c"])])
    assert res.exit_code == 0, res.output


@pytest.mark.slow
@pytest.mark.gptq
def test_a_model_with_both_output_gates_off_loads_through_the_fork(patched_trees, image_python, tmp_path):
    """The module catalogue follows the config end to end: no o_gate/z_proj written, none expected by the fork."""
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize
    from soarpack.sala.tiny import make_tiny_model

    tiny = make_tiny_model(tmp_path / "no-gates", num_layers=4,
                           config_overrides={"attn_use_output_gate": False, "use_output_gate": False})
    quantize(tiny, tmp_path / "q", quantize_options(recipe="w4-full", **FAST))
    result = F.run_fork_check(tmp_path / "q", patched_trees["377b0b5eb"], python=image_python)
    assert result.ok, result.problems
    assert not [r for r in result.rows if r.module.endswith(("o_gate", "z_proj"))]
    assert result.report["unwritten"] == [] and result.report["orphans"] == []


@pytest.mark.slow
@pytest.mark.gptq
def test_a_missing_scales_tensor_leaves_its_parameter_unwritten(quantized, patched_trees, image_python, tmp_path):
    ckpt = _copy(quantized["w4-mlp"], tmp_path / "ckpt")
    _rewrite_tensors(ckpt, lambda s: s.pop("model.layers.1.mlp.down_proj.scales"))
    result = F.run_fork_check(ckpt, patched_trees["377b0b5eb"], python=image_python)
    assert not result.ok
    assert result.problems == ["parameter model.layers.1.mlp.down_proj.scales: never written by load_weights "
                               "(a tensor is missing from the checkpoint)"]
    assert "\n" not in result.summary and "FAIL" in result.summary


@pytest.mark.slow
@pytest.mark.gptq
def test_an_extra_tensor_is_named(quantized, patched_trees, image_python, tmp_path):
    import torch

    ckpt = _copy(quantized["w4-mlp"], tmp_path / "ckpt")
    _rewrite_tensors(ckpt, lambda s: s.update({"model.layers.0.mlp.extra_proj.weight": torch.zeros(4, 4, dtype=torch.bfloat16)}))
    result = F.run_fork_check(ckpt, patched_trees["d29fb130c"], python=image_python)
    assert not result.ok
    assert len(result.problems) == 1, result.problems
    assert result.problems[0].startswith("checkpoint tensor model.layers.0.mlp.extra_proj.weight has no parameter")


@pytest.mark.slow
@pytest.mark.gptq
def test_a_recipe_that_disagrees_with_dynamic_is_caught(quantized, patched_trees, image_python, tmp_path):
    ckpt = _copy(quantized["w4-mlp"], tmp_path / "ckpt")
    raw = json.loads((ckpt / "config.json").read_text())
    from soarpack.recipe.model import load_recipe

    claimed = load_recipe("w4-full")  # the checkpoint carries w4-full's TOML; its dynamic still keeps attention 16-bit
    raw["quantization_config"]["meta"].update(recipe=claimed.name, recipe_toml=claimed.toml_text(),
                                              recipe_sha256=claimed.sha256())
    (ckpt / "config.json").write_text(json.dumps(raw, indent=2))
    result = F.run_fork_check(ckpt, patched_trees["377b0b5eb"], python=image_python)
    assert not result.ok
    assert result.problems and all("recipe w4-full plans W4 g128" in p and "16-bit" in p for p in result.problems)
    assert "model.layers.0.self_attn.qkv_proj: the fork serves it 16-bit" in result.problems[0]
    assert "MISMATCH" in result.table


# -- the child on its own (fast) ------------------------------------------------------------------------------


def _in_child_namespace(code: str, python=sys.executable) -> subprocess.CompletedProcess:
    boot = f"import runpy; ns = runpy.run_path({str(F.CHILD_SCRIPT)!r}); globals().update(ns)\n"
    return subprocess.run([str(python), "-I", "-c", boot + code], capture_output=True, text=True, timeout=120)


def test_stand_ins_answer_only_for_the_listed_gpu_modules():
    code = (
        "import sys\n"
        "finder = StandinFinder(); sys.meta_path.insert(0, finder)\n"
        "from flashinfer.norm import layernorm\n"
        "import sgl_kernel\n"
        "class Sub(sgl_kernel.SomeBase): pass\n"
        "@__import__('tilelang').jit(out_idx=[1])\n"
        "def kernel(): return 7\n"
        "assert kernel() == 7\n"
        "try:\n"
        "    import sgl_kernel.scalar_type\n"
        "except ImportError: print('scalar_type missing')\n"
        "try:\n"
        "    import not_a_gpu_module_xyz\n"
        "except ModuleNotFoundError as e: print('missing', e.name)\n"
        "print(sorted(finder.used))\n"
    )
    proc = _in_child_namespace(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["scalar_type missing", "missing not_a_gpu_module_xyz",
                                        "['flashinfer', 'sgl_kernel', 'tilelang']"]


def test_the_stand_in_list_is_exactly_the_gpu_only_modules():
    proc = _in_child_namespace("print(' '.join(sorted(STANDINS)))")
    assert proc.stdout.split() == sorted(["sgl_kernel", "flashinfer", "fla", "infllm_v2", "sparse_kernel_extension",
                                          "tilelang", "deep_gemm", "vllm", "flash_attn", "torchvision"])


def test_a_missing_non_gpu_module_is_named_not_a_traceback(tiny_quantized_config, tmp_path, sglang_fork_trees):
    """An interpreter without torch: the child names the module in one line."""
    from soarpack.bundle.wheels import find_python310

    bare = find_python310()
    if bare is None:
        if IN_CI:
            pytest.fail("CI needs a CPython 3.10")
        pytest.skip("not run: no CPython 3.10 here")
    probe = subprocess.run([bare, "-I", "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("not run: this CPython 3.10 has torch, so no module is missing")
    result = F.run_fork_check(tiny_quantized_config, sglang_fork_trees["377b0b5eb"], python=bare)
    assert not result.ok
    assert result.problems == ["module 'torch' is missing from this interpreter (the fork's import chain needs it; "
                               "only GPU-only extensions are stood in)"]


# -- bad input (no child runs) --------------------------------------------------------------------------------


@pytest.fixture
def tiny_quantized_config(tmp_path):
    """A directory with a quantized config.json and nothing else: enough for the input checks."""
    from soarpack.sala.tiny import tiny_config_dict

    raw = tiny_config_dict()
    raw["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
                                  "dynamic": {}, "meta": {"recipe": "w4-full"}}
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(raw))
    return ckpt


def test_bad_inputs_are_refused_before_any_child_runs(tiny_quantized_config, tmp_path):
    src = tmp_path / "fork" / "python"
    (src / "sglang").mkdir(parents=True)
    with pytest.raises(CheckpointError, match="is not a directory"):
        F.run_fork_check(tmp_path / "nope", src)
    with pytest.raises(CheckpointError, match="no quantization_config"):
        empty = tmp_path / "plain"
        empty.mkdir()
        (empty / "config.json").write_text(json.dumps({"model_type": "minicpm_sala"}))
        F.run_fork_check(empty, src)
    with pytest.raises(ConfigError, match="holds no sglang"):
        F.run_fork_check(tiny_quantized_config, tmp_path)
    with pytest.raises(ConfigError, match="no recipe named"):
        F.run_fork_check(tiny_quantized_config, src, recipe="w9-nothing")
    with pytest.raises(ConfigError, match="not an executable"):
        F.run_fork_check(tiny_quantized_config, src, python=tmp_path / "python-missing")
    with pytest.raises(ConfigError, match="both name the interpreter"):
        F.run_fork_check(tiny_quantized_config, src, python=sys.executable, dev_stack=True)


def test_cli_exits_2_on_bad_input_with_one_line(tiny_quantized_config, tmp_path):
    res = CliRunner().invoke(app, ["serve-check", str(tiny_quantized_config), "--sglang-src", str(tmp_path / "nowhere")])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "does not exist" in text and "Traceback" not in text


def test_cli_exits_1_on_a_failed_check_and_prints_the_causes(tiny_quantized_config, tmp_path, monkeypatch):
    src = tmp_path / "fork" / "python"
    (src / "sglang").mkdir(parents=True)
    failed = F.ForkCheckResult(False, "fork tree: FAIL: boom", "FAIL boom", ["boom"])
    monkeypatch.setattr(F, "run_fork_check", lambda *a, **k: failed)
    res = CliRunner().invoke(app, ["serve-check", str(tiny_quantized_config), "--sglang-src", str(src)])
    assert res.exit_code == 1
    assert "error: boom" in res.output


def test_the_fork_check_extra_is_the_image_stacks_import_list():
    from soarpack.recipe.files import read_toml
    from soarpack.imagestack import FORK_IMPORT_PACKAGES

    extras = read_toml(Path(__file__).resolve().parent.parent / "pyproject.toml")["project"]["optional-dependencies"]
    assert sorted(extras["fork-check"]) == sorted(FORK_IMPORT_PACKAGES)
