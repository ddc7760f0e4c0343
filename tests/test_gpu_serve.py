"""benchmarks/gpu_serve/: the fork's real server on the lent GPU (dense variant), rehearsed on a CPU.

Fast: the profile, the launcher's argv and environment, the shim in a fresh interpreter (a fake sgl_kernel that has
only some names), the wheel list, the kernel trim, and the token comparison. Slow, on the image stand-in
(CPython 3.10, torch 2.9.1): the shimmed fork's whole dense import closure with sgl_kernel holding exactly
sglang-kernel 0.4.5's names and ops, the launcher's argv through the fork's own ServerArgs, and the comparison's
W4 checkpoint through the fork's own loader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

GPU_SERVE = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_serve"
sys.path.insert(0, str(GPU_SERVE))
sys.path.insert(0, str(GPU_SERVE / "shim"))

import compare  # noqa: E402
import fetch_wheels  # noqa: E402
import launch  # noqa: E402
import soarpack_gpu_shim as shim  # noqa: E402

PROFILE = GPU_SERVE / "dense-bf16.toml"
NAMES = json.loads((GPU_SERVE / "sgl_kernel-0.4.5-names.json").read_text())
OPS = json.loads((GPU_SERVE / "sgl_kernel-0.4.5-ops.json").read_text())
# served-path-h200.md §3.1: what sglang-kernel 0.4.5 lacks of the fork's module-level imports
STUDY_MISSING = {"gptq_marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack", "awq_marlin_moe_repack",
                 "apply_rope_with_cos_sin_cache_inplace", "moe_fused_gate", "kimi_k2_moe_fused_gate",
                 "fp8_blockwise_scaled_mm", "scaled_fp4_quant", "cutlass_scaled_fp4_mm", "FusedSetKVBufferArg"}


# -- the profile and the launcher ------------------------------------------------------------------------------


def test_the_dense_profile_lints_clean_and_is_dense_with_a_bf16_kv_cache(sglang_fork_trees):
    from soarpack.serve.lint import lint_profile
    from soarpack.recipe.profile import load_profile

    prof = load_profile(PROFILE)
    assert lint_profile(PROFILE) == []
    assert lint_profile(PROFILE, server_args_py=sglang_fork_trees["d29fb130c"]) == []
    args = prof.args
    assert args[args.index("--attention-backend") + 1] == "flashinfer" and "--force-dense-minicpm" in args
    assert "--kv-cache-dtype" not in args and args[args.index("--dtype") + 1] == "bfloat16"
    assert prof.recipe == "w4-mlp" and prof.patches == []
    assert launch.read_profile_args(PROFILE) == args


def test_the_launcher_reads_the_profile_without_tomllib_the_same_way(monkeypatch):
    import builtins

    from soarpack.recipe.profile import load_profile

    real_import = builtins.__import__

    def no_tomllib(name, *a, **k):
        if name == "tomllib":
            raise ImportError(name)
        return real_import(name, *a, **k)

    want = load_profile(PROFILE).args
    monkeypatch.setattr(builtins, "__import__", no_tomllib)
    assert launch.read_profile_args(PROFILE) == want


def test_the_launcher_builds_the_platform_launch_line():
    args = launch.read_profile_args(PROFILE)
    argv = launch.server_argv("/ckpt/w4", 31234, args, extra=["--log-level", "info"])
    assert argv[:5] == ["--model-path", "/ckpt/w4", "--trust-remote-code", "--port", "31234"]
    assert argv[5:5 + len(args)] == args
    assert argv[5 + len(args):] == ["--tp-size", "1", "--max-running-requests", "32", "--log-level", "info"]
    bf16 = launch.server_argv("/ckpt/bf16", 30000, args, bf16=True)
    assert "--quantization" not in bf16 and "gptq_marlin" not in bf16
    assert len(bf16) == len(launch.server_argv("/ckpt/bf16", 30000, args)) - 2


def test_the_launcher_environment_puts_the_shim_first(tmp_path):
    env = launch.server_env(tmp_path / "fork", tmp_path / "site", "sgl_marlin.so", base={"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].split(os.pathsep) == [launch.SHIM_DIR, str(tmp_path / "fork"), str(tmp_path / "site"), "/x"]
    assert env["SOARPACK_MARLIN_SO"] == os.path.abspath("sgl_marlin.so") and env["HF_HUB_OFFLINE"] == "1"
    assert env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1" and env["NCCL_NVLS_ENABLE"] == "0"


def test_a_w4_launch_without_the_marlin_extension_is_refused(capsys):
    assert launch.main(["--model-path", "/m", "--fork-src", "/f"]) == 2
    assert "--marlin-so" in capsys.readouterr().err
    assert launch.main(["--model-path", "/m", "--fork-src", "/f", "--print"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cmd"][1:3] == ["-m", "sglang.launch_server"] and "gptq_marlin" in printed["server_args"]


# -- the shim --------------------------------------------------------------------------------------------------


def test_the_shim_adds_exactly_what_sglang_kernel_045_lacks():
    have = set(NAMES["modules"]["sgl_kernel"])
    added = set(shim.PROVIDERS) | set(shim.STUBS)
    assert not added & have, "the shim would shadow a real sglang-kernel 0.4.5 name"
    assert STUDY_MISSING <= added
    assert {"top_k_top_p_sampling_from_probs", "min_p_sampling_from_probs"} <= added  # sampler.py; 0.4.5: musa only
    defined_ops = {s.split("(", 1)[0] for s in OPS["schemas"]}
    assert len(defined_ops) == len(OPS["schemas"]) == 83 and "rmsnorm" in defined_ops
    assert not set(shim.MISSING_OPS) & defined_ops and "moe_fused_gate" in shim.MISSING_OPS


SHIM_PROBE = textwrap.dedent("""
    import json, sys, torch
    out = {}
    import sgl_kernel
    out["real_kept"] = sgl_kernel.rmsnorm == "real" and sgl_kernel.apply_rope_with_cos_sin_cache_inplace == "real"
    out["added"] = sorted(sgl_kernel.__soarpack_shim_added__)
    def err(fn, *a, **k):
        try:
            fn(*a, **k)
        except Exception as exc:
            return type(exc).__name__ + ": " + str(exc)
        return None
    out["stub"] = err(sgl_kernel.moe_fused_gate, 1)
    out["marlin"] = err(sgl_kernel.gptq_marlin_repack, None, None, 1, 1, 4)
    arg = sgl_kernel.FusedSetKVBufferArg(value=1, k_buffer=2, v_buffer=3, k_scale=None, v_scale=None, cache_loc=4)
    out["fused_arg"] = arg.cache_loc
    torch.library.register_fake("sgl_kernel::moe_fused_gate")(lambda *a: None)
    out["op_call"] = err(torch.ops.sgl_kernel.moe_fused_gate, torch.zeros(1), torch.zeros(1), 1, 1, 1, 0, 1.0, False)
    import tilelang, tilelang.language as T, tilelang.math
    cfg = {tilelang.PassConfigKey.TL_DISABLE_TMA_LOWER: True}
    @tilelang.jit(pass_configs=cfg)
    def kernel(n):
        return n
    out["jit"] = err(kernel, 3)
    out["tl_math"] = err(tilelang.math.next_power_of_2, 3)
    from infllm_v2 import infllmv2_attn_stage1
    out["infllm"] = err(infllmv2_attn_stage1)
    from IPython.display import HTML, display
    out["ipython"] = err(display, "x")
    out["ipython_html"] = err(HTML, "x")
    # torchao_utils.apply_torchao_config_to_model imports these before returning on an empty config; the device has
    # no torchao (this venv has a newer one): absent here as on the device, behind the shim's finder
    import sys as _sys

    class _AbsentOnTheDevice:
        def find_spec(self, name, path=None, target=None):
            if name.split(".", 1)[0] == "torchao":
                raise ImportError("absent on the device")
            return None

    _sys.meta_path.insert(1, _AbsentOnTheDevice())
    from torchao.quantization import int4_weight_only, quantize_
    from torchao.quantization.observer import PerRow
    out["torchao"] = err(quantize_, None)
    print(json.dumps(out))
""")


def _probe_env(tmp_path, shim_on=True):
    pkg = tmp_path / "kernel" / "sgl_kernel"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('rmsnorm = "real"\napply_rope_with_cos_sin_cache_inplace = "real"\n')
    env = dict(os.environ)
    env.pop("SOARPACK_MARLIN_SO", None)
    env["PYTHONPATH"] = os.pathsep.join([str(GPU_SERVE / "shim"), str(tmp_path / "kernel"), env.get("PYTHONPATH", "")])
    env["SOARPACK_GPU_SHIM"] = "1" if shim_on else "0"
    return env


@pytest.mark.needs_torch
def test_the_shim_in_a_fresh_interpreter_fills_the_gaps_and_raises_only_when_called(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SHIM_PROBE], env=_probe_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["real_kept"] is True
    assert "apply_rope_with_cos_sin_cache_inplace" not in out["added"] and "gptq_marlin_gemm" in out["added"]
    assert "torch.ops.sgl_kernel.moe_fused_gate" in out["added"]
    assert out["stub"].startswith("NotProvided: sgl_kernel.moe_fused_gate is a soarpack raise-if-called")
    assert out["marlin"].startswith("NotProvided: sgl_kernel.gptq_marlin_repack") and "SOARPACK_MARLIN_SO" in out["marlin"]
    assert out["fused_arg"] == 4
    assert out["op_call"] is not None  # a schema with no kernel: a call raises
    assert out["jit"].startswith("NotProvided: tilelang.jit(kernel)")
    for key in ("tl_math", "infllm", "ipython", "ipython_html", "torchao"):
        assert out[key].startswith("NotProvided"), (key, out[key])


def test_without_the_shim_the_same_imports_fail(tmp_path):
    probe = "import sgl_kernel\nfrom sgl_kernel import gptq_marlin_gemm\n"
    proc = subprocess.run([sys.executable, "-c", probe], env=_probe_env(tmp_path, shim_on=False), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "cannot import name 'gptq_marlin_gemm'" in proc.stderr


# -- the wheels ------------------------------------------------------------------------------------------------


def test_the_wheel_list_pins_one_version_of_each_and_the_fork_stack():
    names = [fetch_wheels.dist_name(r) for r, _ in fetch_wheels.SERVER_WHEELS]
    assert len(names) == len(set(names)) and all("==" in r for r, _ in fetch_wheels.SERVER_WHEELS)
    pins = dict(r.split("==") for r, _ in fetch_wheels.SERVER_WHEELS)
    assert pins["flashinfer-python"] == "0.5.3" and pins["transformers"] == "4.57.1"
    assert pins["fla-core"] == "0.6.0" and pins["apache-tvm-ffi"].startswith("0.1.")
    # found on the device: flash-linear-attention 0.6.0's fla/__init__ imports fla.models (transformers >= 5.6.2), and
    # fastapi 0.162.5 imports opentelemetry at import
    assert "flash-linear-attention" in fetch_wheels.NOT_CARRIED and pins["opentelemetry-api"] == "1.45.2"
    assert tuple(map(int, pins["tokenizers"].split("."))) <= (0, 23, 0) and int(pins["huggingface-hub"].split(".")[0]) < 1
    # a carried package the device already has is carried for another version, and says so
    again = set(names) & fetch_wheels.DEVICE_PACKAGES
    assert again == {"transformers", "tokenizers", "huggingface-hub"}
    assert not set(names) & set(fetch_wheels.NOT_CARRIED)


def test_the_marlin_sources_are_the_forks_two_folders_at_the_commit_and_a_missing_clone_says_how(tmp_path):
    repo = tmp_path / "sglang"
    for rel in ("sgl-kernel/csrc/gemm/marlin/gptq_marlin.cu", "sgl-kernel/include/utils.h",
                "sgl-kernel/csrc/gemm/other.cu", "python/sglang/__init__.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(rel)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "fork"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "sgl-kernel/include/later.h").write_text("not in the commit")
    out = tmp_path / fetch_wheels.MARLIN_ARCHIVE
    assert fetch_wheels.marlin_sources(repo, out, commit=commit) is None
    with tarfile.open(out) as tar:
        files = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert files == ["sgl-kernel/csrc/gemm/marlin/gptq_marlin.cu", "sgl-kernel/include/utils.h"]
    why = fetch_wheels.marlin_sources(tmp_path / "nowhere", tmp_path / "none.tar.gz")
    assert "fetch github:tc-mb/sglang" in why and not (tmp_path / "none.tar.gz").exists()
    why = fetch_wheels.marlin_sources(repo, tmp_path / "bad.tar.gz", commit="0" * 40)
    assert "git archive" in why and not list(tmp_path.glob("bad.*"))


def test_the_kernel_trim_keeps_the_python_files_and_sm90_common_ops_only(tmp_path):
    wheel = tmp_path / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl"
    members = ["sgl_kernel/__init__.py", "sgl_kernel/infllm_v2/attention.py", "sgl_kernel/sm90/common_ops.abi3.so",
               "sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/flash_ops.abi3.so",
               "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so", "sglang_kernel-0.4.5.dist-info/METADATA"]
    with zipfile.ZipFile(wheel, "w") as zf:
        for m in members:
            zf.writestr(m, m)
    out = fetch_wheels.trim_kernel(wheel, tmp_path / "k.tar.gz")
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == sorted(set(members) - {"sgl_kernel/sm100/common_ops.abi3.so",
                                                                "sgl_kernel/flash_ops.abi3.so",
                                                                "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so"})


# -- the comparison --------------------------------------------------------------------------------------------


def _ref(tokens, margins=None):
    return {"quantized": False, "rows": [{"input_ids": [i], "tokens": t, "margins": margins or [0.5] * len(t)}
                                         for i, t in enumerate(tokens)]}


def test_the_comparison_counts_equal_tokens_and_names_the_first_difference():
    want = [list(range(16)), list(range(16, 32)), list(range(32, 48))]
    got = [list(w) for w in want]
    got[1][10] = 999
    ref, served = _ref(want), {"rows": [{"input_ids": [i], "tokens": t} for i, t in enumerate(got)]}
    rows, ok = compare.compare_rows(ref, served, 16)
    assert not ok and [r[1] for r in rows] == [16, 15, 16] and rows[1][2] == 10 and rows[1][3] == 0.5
    rows, ok = compare.compare_rows(ref, served, 15)
    assert ok
    served["rows"][2]["tokens"] = want[2][:15]  # a short answer never passes
    assert not compare.compare_rows(ref, served, 15)[1]
    served["rows"][0]["input_ids"] = [7]
    with pytest.raises(SystemExit):
        compare.compare_rows(ref, served, 15)


def _followed(deficits):
    return {"rows": [{"input_ids": [i], "served": list(range(16)), "ref_argmax": [t if d == 0 else t + 1
                      for t, d in enumerate(row)], "deficits": row, "margins": [0.01] * 16}
                     for i, row in enumerate(deficits)]}


def test_the_followed_comparison_counts_ties_as_greedy_and_holds_the_bar():
    exact = [0.0] * 16
    one_miss = [0.0] * 15 + [0.002]
    two_misses = [0.0, 0.002] + [0.0] * 13 + [0.002]
    rows, ok = compare.followed_rows(_followed([exact, one_miss, two_misses]), 15)
    assert [r[1] for r in rows] == [16, 15, 14] and [r[3] for r in rows] == [0.0, 0.002, 0.002] and not ok
    assert compare.followed_rows(_followed([exact, one_miss]), 15)[1]
    assert not compare.followed_rows(_followed([exact, one_miss]), 16)[1]
    # a tie: the served token is not the reference's argmax but sits at its maximum logit: a greedy choice
    tie = _followed([exact])
    tie["rows"][0]["ref_argmax"][3] = 99
    rows, ok = compare.followed_rows(tie, 16)
    assert ok and rows[0][1] == 16 and rows[0][2] == 15
    assert "| 16/16 | 15/16 | 0.0000 | ok" in compare.render_followed(rows, 16, 16)


@pytest.mark.needs_torch
@pytest.mark.parametrize("neox", [True, False])
def test_the_shims_fp32_rope_is_the_forks_native_rope_in_place(neox):
    """SALA casts q and k to fp32 before its rope; flashinfer dispatches fp16/bf16 only (found on the device)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    head, rot, heads = 128, 64, 4
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    freqs = torch.outer(torch.arange(512).float(), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    pos = torch.randint(0, 512, (7,), generator=gen)
    q = torch.randn(7, heads * head, generator=gen)
    k = torch.randn(7, 1 * head, generator=gen)

    def native(x):  # RotaryEmbedding.forward_native (the fork's rotary_embedding.py), written out independently
        x = x.view(7, -1, head).clone()
        cos, sin = cache[pos].chunk(2, dim=-1)
        cos, sin = cos[:, None], sin[:, None]
        part = x[..., :rot]
        if neox:
            a, b = part[..., : rot // 2], part[..., rot // 2:]
            x[..., :rot] = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
        else:
            a, b = part[..., 0::2], part[..., 1::2]
            x[..., :rot] = torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
        return x.view(7, -1)

    want_q, want_k = native(q), native(k)
    got_q, got_k = q.clone(), k.clone()
    ptr = got_q.data_ptr()
    shim.apply_rope_with_cos_sin_cache_inplace(pos, got_q, got_k, head, cache, is_neox=neox)
    assert got_q.data_ptr() == ptr and torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(got_q.view(7, heads, head)[..., rot:], q.view(7, heads, head)[..., rot:])  # past rotary_dim
    assert not torch.equal(got_q, q)


def test_served_tokens_come_from_output_ids_or_the_logprob_records():
    assert compare.served_tokens({"output_ids": [5, 6]}) == [5, 6]
    assert compare.served_tokens({"meta_info": {"output_token_logprobs": [[-0.1, 7, None], [-0.2, 8, None]]}}) == [7, 8]


@pytest.mark.needs_torch
def test_the_rtn_w4_tensors_read_the_same_as_gptq_and_as_marlin():
    import torch

    from soarpack.quant.gptq_format import dequantize

    w = 0.02 * torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    parts = compare.rtn_gptq(w, 128, 4)
    as_gptq = dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], 4, 128)
    as_marlin = dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], 4, 128, marlin=True)
    assert torch.equal(as_gptq, as_marlin)
    step = parts["scales"].float().t().repeat_interleave(128, dim=1)  # [out, in]
    assert bool(((as_gptq - w).abs() <= step / 2 + 1e-6).all()) and not torch.equal(as_gptq, w)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """The comparison's own bf16 and w4-mlp checkpoints, at the tiny shape (2 layers: sparse, lightning)."""
    work = tmp_path_factory.mktemp("gpu-serve")
    assert compare.main(["build", "--out", str(work / "bf16"), "--shape", "tiny"]) == 0
    assert compare.main(["w4", "--src", str(work / "bf16"), "--out", str(work / "w4")]) == 0
    return work / "bf16", work / "w4"


@pytest.mark.needs_torch
def test_the_reference_is_soarpacks_own_greedy_decode(tiny_pair, tmp_path):
    import torch

    from soarpack.quant.dequantize import load_dequantized
    from soarpack.sala.checkpoint import load_model

    for ckpt, model in ((tiny_pair[0], load_model(tiny_pair[0])),
                        (tiny_pair[1], load_dequantized(tiny_pair[1], dtype=torch.bfloat16, marlin=True))):
        out = tmp_path / f"{ckpt.name}.json"
        assert compare.main(["reference", "--ckpt", str(ckpt), "--out", str(out), "--device", "cpu"]) == 0
        ref = json.loads(out.read_text())
        assert ref["quantized"] is (ckpt.name == "w4") and len(ref["rows"]) == len(compare.PROMPTS)
        for row in ref["rows"]:
            greedy = model.greedy(torch.tensor([row["input_ids"]]), 16)[0].tolist()
            assert row["tokens"] == greedy and min(row["margins"]) >= 0
    raw = json.loads((tiny_pair[1] / "config.json").read_text())
    assert raw["quantization_config"]["meta"]["recipe"] == "w4-mlp" and raw["quantization_config"]["sym"] is True


@pytest.mark.needs_torch
def test_the_padded_tokenizer_decodes_every_id_the_model_can_emit_and_encodes_as_before(tiny_pair, tmp_path):
    # The server streams text only for ids its detokenizer knows; the bench times a stream by its chunks with text.
    import shutil

    from tokenizers import Tokenizer

    ckpt = tmp_path / "m"
    shutil.copytree(tiny_pair[0], ckpt)
    raw = json.loads((ckpt / "config.json").read_text())
    before = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    raw["vocab_size"] = before.get_vocab_size() + 40
    (ckpt / "config.json").write_text(json.dumps(raw))
    assert compare.pad_tokenizer_to_vocab(ckpt) == 40
    after = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    assert after.get_vocab_size() == raw["vocab_size"]
    new = range(before.get_vocab_size(), raw["vocab_size"])
    assert all(after.decode([i]) == f" w{i}" for i in new)
    text = "The capital of France is " + " ".join(f"w{i}" for i in new)
    assert after.encode(text).ids == before.encode(text).ids  # the added tokens are unreachable by encoding
    assert compare.pad_tokenizer_to_vocab(ckpt) == 0


def test_the_python_wrapper_runs_with_the_servers_environment(tmp_path):
    wrapper = tmp_path / "serve-python"
    assert launch.main(["--write-python", str(wrapper), "--fork-src", str(tmp_path / "fork"), "--site",
                        str(tmp_path / "site"), "--marlin-so", str(tmp_path / "m.so")]) == 0
    probe = "import os, sys; print(os.environ['PYTHONPATH']); print(os.environ['SOARPACK_MARLIN_SO']); print(sys.argv[1:])"
    out = subprocess.run([str(wrapper), "-c", probe, "a b"], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"]}).stdout.splitlines()
    assert out[0].split(os.pathsep)[:3] == [launch.SHIM_DIR, str(tmp_path / "fork"), str(tmp_path / "site")]
    assert out[1] == str(tmp_path / "m.so") and out[2] == "['a b']"
    with pytest.raises(SystemExit):
        launch.parse(["--fork-src", "/f"])  # neither a model path nor a wrapper to write


def test_the_public_slice_has_every_scored_task_and_loads_as_the_public_set(tmp_path):
    import public_slice

    from soarpack.measure.evaluate import load_eval_rows
    from soarpack.measure.scoring import ANY_HIT_TASKS, FRACTION_TASKS, MCQ_TASKS, score_prediction

    out = tmp_path / "slice.jsonl"
    assert public_slice.main(["--out", str(out), "--per-task", "2", "--haystack-words", "300"]) == 0
    rows = load_eval_rows(out)
    assert len(rows) == 12 and {r["task"] for r in rows} == MCQ_TASKS | ANY_HIT_TASKS | FRACTION_TASKS
    niah = next(r for r in rows if r["task"] == "niah")
    assert niah["gold"][0] in niah["question"] and len(niah["question"].split()) > 300
    assert all(score_prediction(r["task"], "ANSWER: " + " ".join(r["gold"]), r["gold"])[0] == 1.0 for r in rows)


def test_the_served_table_gives_each_tier_its_ratio_to_the_baseline(tmp_path, capsys):
    import served_table

    def result(s1, s8):
        tier = lambda d: {"duration_s": d, "ttft_ms": {"mean": 100.0, "median": 90.0, "p99": 300.0},  # noqa: E731
                          "itl_ms": {"mean": 7.5, "median": 7.0, "p99": 9.0}, "output_throughput": 10.0}
        return {"kind": "soarpack.bench", "tiers": {"s1": tier(s1), "s8": tier(s8)}}

    paths = {}
    for label, times in (("bf16", (40.0, 20.0)), ("w4", (32.0, 16.0))):
        paths[label] = tmp_path / f"{label}.json"
        paths[label].write_text(json.dumps(result(*times)))
    assert served_table.main([f"{k}={v}" for k, v in paths.items()]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "s1 | w4 | 32.00 | 1.25x | 100.0 / 90.0 / 300.0 | 7.50 / 7.00 / 9.00 | - | 10" in lines
    assert "s8 | bf16 | 20.00 | 1.00x |" in " ".join(lines)
    with pytest.raises(SystemExit, match="no run is labelled"):
        served_table.main([f"bf16={paths['bf16']}", "--baseline", "fp8"])


def test_the_health_wait_stops_when_the_server_process_has_died():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with pytest.raises(SystemExit, match="exited before"):
        compare.main(["wait", "--url", "http://127.0.0.1:9", "--wait", "30", "--pid", str(dead.pid)])


# -- on the image stand-in: the fork's own code ----------------------------------------------------------------




EXTRA_PINS = ("jsonschema==4.26.0", "referencing==0.37.0", "rpds-py==0.30.0", "jsonschema-specifications==2025.9.1")


@pytest.fixture(scope="session")
def extra_site(image_python):
    """What the fork's HTTP server imports and the image stand-in lacks (jsonschema): once, beside the stand-in."""
    from soarpack.imagestack import cache_root, clean_env, make_cache_dir

    target = make_cache_dir(cache_root() / "gpu-serve", "gpu-serve extras") / "extra-cp310"  # marked: clear may delete it
    marker = target / ".ready"
    if not marker.is_file():
        proc = subprocess.run([str(image_python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "--target", str(target), *EXTRA_PINS], env=clean_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            if os.environ.get("CI") == "true":
                pytest.fail(proc.stderr[-500:])
            pytest.skip(f"not run: cannot install {EXTRA_PINS[0]} for the stand-in: {proc.stderr[-200:]}")
        marker.write_text("\n".join(EXTRA_PINS))
    return target


def _rehearse(image_python, fork, result, *extra, env_extra=None):
    from soarpack.imagestack import clean_env

    env = clean_env()
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(env_extra or {})
    cmd = [str(image_python), str(GPU_SERVE / "rehearse_closure.py"), "--fork-src", str(fork), "--result", str(result),
           *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert result.is_file(), proc.stderr[-3000:]
    return json.loads(result.read_text()), proc


def _closure_args(extra_site, kernel):
    args = ["--extra-site", str(extra_site)]
    for name in fetch_wheels.REHEARSAL_ABSENT:
        args += ["--absent", name]
    return args + kernel


def _check_closure(report):
    assert report["ok"], report["failed"]
    assert report["python"].startswith("3.10.") and report["torch"].startswith("2.9.1")
    names = report["kernel_names"]
    left_out = tuple(m + "." for m in report["strict_left_out"])
    unresolved = {q: v for q, v in names.items() if v["provider"] is None and not q.startswith(left_out)}
    assert not unresolved and len(names) > 40
    # cutlass_scaled_fp4_mm: modelopt_quant.py imports it only when flashinfer lacks mm_fp4 (0.5.3 has it)
    assert STUDY_MISSING - {"cutlass_scaled_fp4_mm"} <= set(names)
    for name in STUDY_MISSING & set(names):
        assert names[name]["provider"] == shim.PROVIDERS.get(name, f"stub ({shim.STUBS.get(name)})")
    assert names["rmsnorm"]["provider"] == "sglang-kernel 0.4.5"
    assert names["gptq_marlin_gemm"]["modules"] == ["sglang.srt.layers.quantization.marlin_utils",
                                                    "sglang.srt.layers.quantization.marlin_utils_fp8"]
    assert report["shim_standins"] == ["IPython", "infllm_v2", "tilelang", "torchao"]
    assert report["sparse_kernel_extension_imported"] is False
    assert "torch.ops.sgl_kernel.moe_fused_gate" in report["shim_added"]
    assert fetch_wheels.uncovered(report["distributions_loaded"]) == []
    assert not {"xgrammar", "torchao", "ipython"} & set(report["distributions_loaded"])


@pytest.mark.slow
@pytest.mark.image_stack
def test_the_shimmed_fork_imports_its_whole_dense_closure(image_python, extra_site, sglang_fork_trees, tmp_path):
    fork = sglang_fork_trees["d29fb130c"]
    names = GPU_SERVE / "sgl_kernel-0.4.5-names.json"
    report, proc = _rehearse(image_python, fork, tmp_path / "closure.json",
                             *_closure_args(extra_site, ["--kernel-names", str(names)]))
    _check_closure(report)
    assert len(report["imported"]) == 17 and report["strict_left_out"] == ["sgl_kernel.scalar_type"]
    # the same closure without the shim (IPython left installed, so the sgl_kernel gaps are what fails)
    bare, _ = _rehearse(image_python, fork, tmp_path / "bare.json", "--extra-site", str(extra_site),
                        "--absent", "xgrammar", "--absent", "torchao", "--kernel-names", str(names), "--no-shim")
    errors = set(bare["failed"].values())
    assert not bare["ok"] and errors and all(e.startswith("ImportError: cannot import name ") for e in errors), errors
    assert any("'gptq_marlin_gemm'" in e for e in errors) and any("'FusedSetKVBufferArg'" in e for e in errors)


def _kernel_tree(tmp_path):
    archive = Path(os.environ.get("SOARPACK_SGLANG_KERNEL_TRIM", GPU_SERVE.parent.parent / ".whl" /
                                  "sglang-kernel-0.4.5-sm90.tar.gz"))
    if not archive.is_file():
        pytest.skip(f"not run: no trimmed sglang-kernel 0.4.5 at {archive} (benchmarks/gpu_serve/fetch_wheels.py)")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "kernel", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return tmp_path / "kernel"


@pytest.mark.slow
@pytest.mark.image_stack
def test_the_closure_holds_with_the_real_sglang_kernel_045_python(image_python, extra_site, sglang_fork_trees,
                                                                   tmp_path):
    tree = _kernel_tree(tmp_path)
    report, _ = _rehearse(image_python, sglang_fork_trees["d29fb130c"], tmp_path / "closure.json",
                          *_closure_args(extra_site, ["--kernel-tree", str(tree)]))
    _check_closure(report)
    assert report["kernel_source"] == "tree"


@pytest.mark.slow
@pytest.mark.image_stack
@pytest.mark.needs_torch
def test_the_launchers_argv_parses_through_the_forks_server_args(image_python, extra_site, sglang_fork_trees,
                                                                tiny_pair, tmp_path):
    argv = launch.server_argv(tiny_pair[1], 31234, launch.read_profile_args(PROFILE), extra=["--skip-tokenizer-init"])
    (tmp_path / "argv.json").write_text(json.dumps(argv))
    args = _closure_args(extra_site, ["--kernel-names", str(GPU_SERVE / "sgl_kernel-0.4.5-names.json"),
                                      "--parse-args", str(tmp_path / "argv.json")])
    env = {k: v for k, v in launch.server_env("/f").items() if k in launch.SERVER_ENV}
    report, proc = _rehearse(image_python, sglang_fork_trees["d29fb130c"], tmp_path / "parse.json", *args,
                             env_extra=env)
    assert report["ok"], proc.stderr[-2000:]
    assert report["engine_env"] == "ok"
    # without the launcher's switch the fork's launch refuses (on this CPU flashinfer's check fails first; on the
    # device sgl-kernel's would: the distribution there is sglang-kernel)
    assert report["sgl_kernel_version_check"].startswith(
        "Exception: sgl-kernel with minimum required version 0.3.20 is not installed")
    bare, _ = _rehearse(image_python, sglang_fork_trees["d29fb130c"], tmp_path / "bare.json", *args)
    assert "with minimum required version" in bare["engine_env"] and "is not installed" in bare["engine_env"]
    f = report["fields"]
    assert f["model_path"] == str(tiny_pair[1]) == report["model_path_given"] and f["port"] == 31234
    assert (f["attention_backend"], f["quantization"], f["dtype"], f["kv_cache_dtype"]) == \
        ("flashinfer", "gptq_marlin", "bfloat16", "auto")
    assert f["force_dense_minicpm"] is True and f["grammar_backend"] == "none" and f["disable_cuda_graph"] is False
    assert (f["tp_size"], f["max_running_requests"], f["cuda_graph_max_bs"]) == (1, 32, 32)
    assert f["skip_tokenizer_init"] is True  # device_run.sh's SERVE_EXTRA


@pytest.mark.slow
@pytest.mark.image_stack
@pytest.mark.needs_torch
def test_the_comparisons_w4_checkpoint_loads_through_the_forks_loader(image_python, sglang_fork_trees, tiny_pair):
    from soarpack.serve import forkcheck as F

    result = F.run_fork_check(tiny_pair[1], sglang_fork_trees["d29fb130c"], python=image_python,
                              server_args=launch.read_profile_args(PROFILE))
    assert result.ok, result.problems
    served = {(r.module.rsplit(".", 1)[-1], r.method) for r in result.rows}
    assert ("gate_up_proj", "GPTQMarlinLinearMethod") in served and ("down_proj", "GPTQMarlinLinearMethod") in served
    assert ("qkv_proj", "UnquantizedLinearMethod") in served
