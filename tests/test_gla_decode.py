"""Patch 06-gla-decode-in-place: the Lightning layers' decode step on the state pool in place.

The kernel is the block the patch adds to the fork's hybrid_linear_attn_backend.py (soarpack.kernels.block reads
it from the patch; benchmarks/gla_decode_harness.py from a patched tree, with the patched forward() itself). On
the CPU it runs under Triton's interpreter (TRITON_INTERPRET=1), against
- the fork's own decode path: the same patched forward() with SOARPACK_GLA_DECODE=fork, i.e. the fork's gather ->
  fla-core 0.6.0's fused_recurrent_simple_gla -> scatter lines, also under the interpreter;
- a plain float64 recurrence.
The interpreter truncates float32 -> bf16 casts (GPU code rounds to nearest, as torch does), so with bf16
activations the fork's path is fed the same values upcast to float32 (fla upcasts every load: the same
arithmetic) and its float32 output is truncated here the same way; with float32 activations nothing is cast and
outputs and states must match bit for bit. The bf16 bits themselves are the GPU run's (benchmarks/gpu_gla_decode.py).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import torch  # noqa: E402  (conftest.NEEDS_TORCH lists this file)

if not torch.cuda.is_available():  # read when a kernel is decorated, so before anything imports a kernel module
    os.environ.setdefault("TRITON_INTERPRET", "1")

from soarpack.kernels import block as B  # noqa: E402
from soarpack.serve import patches as P  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import gla_decode_harness as H  # noqa: E402

BACKEND = H.BACKEND
NEEDS_TRITON = "triton and fla-core are not installed (the `kernels` extra: pip install -e '.[kernels]')"


@pytest.fixture(scope="module")
def patched_trees(patched_fork_trees):
    return patched_fork_trees


# -- the patch, torch only ---------------------------------------------------------------------------------------


def test_the_patch_applies_to_both_commits_and_adds_one_block(sglang_fork_trees, patched_trees):
    source = B.block_source(block=B.GLA_DECODE)
    for commit, src in sglang_fork_trees.items():
        report = P.check_tree(src, ["gla-decode-in-place"])
        assert [(p.name, p.status) for p in report.patches] == [("gla-decode-in-place", "apply")], commit
        again = P.check_tree(patched_trees[commit])
        assert (again.commit, again.state) == (commit, "patched")
        path = patched_trees[commit] / BACKEND
        assert B.file_block_source(path, B.GLA_DECODE) == source  # the patch's block is the tree's, verbatim
        whole = path.read_text()
        assert whole.count(B.GLA_DECODE.begin) == 1
        assert whole.index(B.GLA_DECODE.end) < whole.index("class SimpleGLAAttnBackend(")
        assert P.apply_patches(patched_trees[commit], patched_trees[commit]).written == []


def _forward_node(path: Path) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SimpleGLAAttnBackend"]
    (fwd,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    return fwd


def test_only_decode_takes_the_kernel_and_the_forks_path_is_kept(patched_trees):
    """forward's first branch is decode-and-inplace, returning the kernel's output; the fork's lines follow
    unchanged (gather, fused_recurrent / chunk, scatter), so prefill, mixed batches, mode 'fork' and a failed kernel
    run them."""
    fwd = _forward_node(patched_trees["d29fb130c"] / BACKEND)
    branch = next(n for n in fwd.body if isinstance(n, ast.If))
    assert ast.unparse(branch.test) == "forward_batch.forward_mode.is_decode() and SOARPACK_GLA_DECODE_MODE == 'inplace'"
    last = branch.body[-1]  # the kernel's output, unless it failed: then the fork's lines below
    assert ast.unparse(last.test) == "o is not None" and isinstance(last.body[-1], ast.Return) and not branch.orelse
    call = next(n for n in ast.walk(branch) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "soarpack_gla_decode_or_none")
    assert [ast.unparse(a) for a in call.args] == [
        "q", "k", "v", "layer_cache.temporal", "self._get_mamba_indices(forward_batch)", "self.g_gamma", "self.scale"]
    rest = ast.unparse(ast.Module(body=fwd.body[fwd.body.index(branch) + 1:], type_ignores=[]))
    for line in ("initial_state = layer_cache.temporal[mamba_indices, :].contiguous()",
                 "layer_cache.temporal[mamba_indices, :] = final_state", "chunk_simple_gla(", "fused_recurrent_simple_gla("):
        assert line in rest
    (patch,) = [p for p in P.load_patches() if p.name == "gla-decode-in-place"]
    removed = [t for fd in patch.files for h in fd.hunks for tag, t in h.lines if tag == "-"]
    assert removed == []  # the patch only adds lines


# -- the kernel, under Triton's interpreter ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def fla():
    try:
        import fla  # noqa: F401
        import triton  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":  # scripts/install.sh installs the extra: missing there is a broken install
            pytest.fail(NEEDS_TRITON)
        pytest.skip(NEEDS_TRITON)
    funcs = H.load_fla()
    H.force_fla_num_warps(4)  # the interpreter cannot autotune; on a GPU the order depends on it (harness doc)
    yield funcs
    H.force_fla_num_warps(None)


@pytest.fixture(scope="module")
def backend_file(patched_trees):
    return patched_trees["d29fb130c"] / BACKEND


@pytest.fixture(scope="module")
def forwards(fla, backend_file):
    return {mode: H.Forward(backend_file, mode, fla) for mode in ("inplace", "fork")}


def _twin_backends(case, forwards, layer_ids):
    """({name: pools}, {name: backend}): each Forward on pools of its own, all with the same graph-replay metadata."""
    pools = {name: case.pools() for name in forwards}
    backends = {name: f.backend(pools[name], layer_ids, case.g_gamma, case.scale) for name, f in forwards.items()}
    slots, qsl = H.replay_metadata(case.live_slots, case.batch, case.device)
    for b in backends.values():
        H.set_metadata(b, slots, qsl)
    return pools, backends


def _steps(case, forwards, steps, layer_ids=(1, 4)):
    """Run `steps` decode steps of both modes on twin pools; every output and the whole pools are compared."""
    assert case.layers == len(layer_ids)
    pools, backends = _twin_backends(case, forwards, layer_ids)
    for step in range(steps):
        layer = layer_ids[step % len(layer_ids)]
        got, want = H.step_pair(backends["inplace"], backends["fork"], *case.qkv(), layer)
        assert got.shape == (case.batch, case.heads * case.dim) and got.dtype == case.dtype
        diff = H.first_difference(got[:case.live], want[:case.live])
        assert diff == "", f"step {step}, layer {layer}: output {diff}"
        assert not got[case.live:].any(), "a padded row's output is not zero"
        for i, (a, b) in enumerate(zip(pools["inplace"], pools["fork"])):
            assert H.first_difference(a, b) == "", f"step {step}: pool {i} {H.first_difference(a, b)}"
    return pools


@pytest.mark.parametrize("batch,live,steps", [(1, 1, 6), (8, 6, 3), (32, 27, 2)])
def test_in_place_matches_the_forks_path_bf16(forwards, batch, live, steps):
    """bf16 activations as the model has them (views into one fused qkv row), a non-contiguous spread of slots,
    the padded rows of a graph replay (slot -1, empty sequence), two layers' pools, consecutive steps."""
    case = H.Case(batch=batch, live=live, heads=2, dim=128, slots_total=40, layers=2, seed=batch)
    pools = _steps(case, forwards, steps)
    # the fork's path never changes a slot outside the batch either; check the in-place pools did not
    untouched = [s for s in range(case.slots_total + 1) if s not in case.live_slots]  # the dummy slot included
    for got, start in zip(pools["inplace"], case.initial):
        assert torch.equal(got[untouched].view(torch.int32), start[untouched].view(torch.int32))
        assert not torch.equal(got[case.live_slots], start[case.live_slots])


def test_in_place_matches_the_forks_path_float32_bit_for_bit(forwards):
    """With float32 activations nothing is cast: outputs and states equal fla's bit for bit."""
    case = H.Case(batch=8, live=5, heads=2, dim=128, slots_total=24, layers=2, seed=3, dtype=torch.float32)
    _steps(case, forwards, 2)


def test_in_place_follows_the_float64_recurrence(fla):
    """The kernel itself (read from the patch file) over several steps against the recurrence in float64."""
    gla = B.load_gla_decode_block(mode="")
    case = H.Case(batch=8, live=6, heads=2, dim=128, slots_total=30, seed=11, dtype=torch.float32)
    pool = case.pools()[0]
    slots, _ = H.replay_metadata(case.live_slots, case.batch, "cpu")
    ref = case.initial[0][case.live_slots].double()
    for step in range(4):
        q, k, v = case.qkv()
        out = gla.soarpack_gla_decode(q, k, v, pool, slots, case.g_gamma, case.scale)
        ref, ref_o = H.reference_step(ref, q[:, :6], k[:, :6], v[:, :6], case.g_gamma, case.scale)
        assert out.shape == (1, 8, 2, 128) and out.dtype == torch.float32
        assert ((out[0, :6].double() - ref_o).norm() / ref_o.norm()).item() < 1e-5, step
        assert ((pool[case.live_slots].double() - ref).norm() / ref.norm()).item() < 1e-6, step
        assert not out[0, 6:].any()


def test_a_kernel_that_fails_hands_every_later_step_to_the_forks_path(fla, backend_file, forwards, caplog):
    """A kernel this GPU's Triton cannot build or launch costs the speed-up, not the server: the step it failed on
    and every later one take the fork's lines, with one warning, and the states stay the fork's."""
    fails = H.Forward(backend_file, "inplace", fla, strict=False)
    calls = []

    def refused(*args):
        calls.append(args)
        raise RuntimeError("out of resources: shared memory, Required: 262144, Hardware limit: 101376")

    fails.block.soarpack_gla_decode = refused
    case = H.Case(batch=4, live=3, heads=2, dim=128, slots_total=12, layers=1, seed=5, dtype=torch.float32)
    strict = H.Forward(backend_file, "inplace", fla, block=fails.block)  # the same block, as the harness runs it
    pools, backends = _twin_backends(case, {"fails": fails, "fork": forwards["fork"], "strict": strict}, (1,))
    with caplog.at_level("WARNING", logger="sglang.soarpack"):
        for _ in range(3):
            q, k, v = case.qkv()
            got, want = (backends[m].forward(q, k, v, H.decode_batch(), 1) for m in ("fails", "fork"))
            assert torch.equal(got[:case.live], want[:case.live])  # a padded row: whatever fla left there
            assert torch.equal(pools["fails"][0], pools["fork"][0])
    assert len(calls) == 1  # tried once, never again in this process
    assert fails.block.SOARPACK_GLA_DECODE_FAILED == [
        "RuntimeError: out of resources: shared memory, Required: 262144, Hardware limit: 101376"]
    (warning,) = [r.getMessage() for r in caplog.records if "gla-decode" in r.getMessage()]
    assert "the fork's decode path serves from now on" in warning and "out of resources" in warning
    with pytest.raises(RuntimeError, match="the in-place kernel failed and the fork's path answered"):
        backends["strict"].forward(*case.qkv(), H.decode_batch(), 1)  # never the fork's output passed off as the kernel's


def test_the_mode_switch_and_bad_inputs(fla):
    gla = B.load_gla_decode_block(mode="")
    assert gla.SOARPACK_GLA_DECODE_MODE == "inplace"
    assert B.load_gla_decode_block(mode=" Fork ").SOARPACK_GLA_DECODE_MODE == "fork"
    assert gla.soarpack_gla_decode_mode("inplace") == "inplace"
    with pytest.raises(ValueError, match="SOARPACK_GLA_DECODE='off': expected one of inplace, fork"):
        B.load_gla_decode_block(mode="off")
    state = torch.zeros(5, 2, 128, 128)
    q = torch.zeros(1, 3, 2, 128)
    slots = torch.tensor([0, 1, 2], dtype=torch.int32)
    g = torch.zeros(2)
    with pytest.raises(ValueError, match="each slot contiguous"):
        gla.soarpack_gla_decode(q, q, q, state.transpose(2, 3), slots, g, 1.0)
    with pytest.raises(ValueError, match="multiples of 64"):
        gla.soarpack_gla_decode(q[..., :96], q[..., :96], q[..., :96], torch.zeros(5, 2, 96, 96), slots, g, 1.0)
    with pytest.raises(ValueError, match=r"q is \(2, 2, 128\), expected \(3, 2, 128\)"):
        gla.soarpack_gla_decode(q[:, :2], q, q, state, slots, g, 1.0)
    with pytest.raises(ValueError, match="g_gamma must be float32"):
        gla.soarpack_gla_decode(q, q, q, state, slots, g.double(), 1.0)
    assert gla.soarpack_gla_decode(q[:, :0], q[:, :0], q[:, :0], state, slots[:0], g, 1.0).shape == (1, 0, 2, 128)


# -- what Triton makes of it for the H200, compiled here (no GPU needed) ------------------------------------------


# The platform's Triton (3.5.1: torch 2.9.1's pin), which scripts/install.sh puts beside .venv's 3.6.0.
PLATFORM_TRITON = ROOT / ".venv" / "triton-platform"


def _codegen(arch: str, triton_path=None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if triton_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(triton_path), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gla_decode_harness.py"), arch, "4,8"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_sm90_code_has_flas_layout_and_flas_arithmetic_per_tile(fla):
    """Both kernels compiled for sm_90 by this Triton (the device's version): the state tile's layout, which fixes
    the order of the per-tile reduction, is fla's at 4 and 8 warps; per 64 x 64 tile the same FMAs, shuffles and
    16-byte state loads/stores; one exp; the output cast rounds to nearest (cvt.rn)."""
    report = _codegen("sm90")
    assert report.pop("triton") == "3.6.0"
    for nw, kernels in report.items():
        fla_k, ours = kernels["fla"], kernels["inplace"]
        assert ours["layouts"] == fla_k["layouts"] and ours["layouts"], nw
        assert set(ours["reduce_operands"]) == set(fla_k["reduce_operands"]) == {"64x64xf32, #blocked"}, nw
        nk = 2  # K tiles per program: fla runs each tile in a program of its own
        for op in ("fma.rn.f32", "shfl.sync.bfly.b32", "ld.global.v4.b32", "st.global.v4.b32"):
            assert ours["ops"].get(op, 0) == nk * fla_k["ops"].get(op, 0) > 0, (nw, op)
        assert ours["ops"]["ex2.approx.f32"] == fla_k["ops"]["ex2.approx.f32"] == 1
        assert ours["ops"].get("cvt.rn.bf16.f32", 0) > 0 and not any("cvt.rz" in op for op in ours["ops"])


@pytest.mark.skipif(not PLATFORM_TRITON.is_dir(), reason="the platform's Triton is installed by scripts/install.sh")
def test_the_platforms_triton_builds_patch_06_for_hopper_as_fla_and_for_blackwell(fla):
    """The platform compiles patch 06's kernel with its own Triton, for its own GPU (sm_120), at the first CUDA-graph
    capture: a kernel that does not compile there stops the server. Compiled here to a cubin by Triton 3.5.1's ptxas:
    for sm_90 its code is fla's tile for tile as under 3.6.0 (the bit-identity the H200 showed rests on that), and for
    sm_120 it builds, with the same layouts and fused multiply-adds as fla's, though not the same packing of
    Blackwell's f32x2 operations: bit-identity there is not shown."""
    hopper, blackwell = _codegen("sm90", PLATFORM_TRITON), _codegen("sm120", PLATFORM_TRITON)
    assert hopper.pop("triton") == blackwell.pop("triton") == "3.5.1"
    assert hopper == {k: v for k, v in _codegen("sm90").items() if k != "triton"}  # 3.5.1's code is 3.6.0's
    for nw, kernels in blackwell.items():
        fla_k, ours = kernels["fla"], kernels["inplace"]
        assert ours["layouts"] == fla_k["layouts"] and ours["layouts"], nw
        assert ours["f32_lanes"]["fma.rn.f32"] == 2 * fla_k["f32_lanes"]["fma.rn.f32"] > 0, nw
        assert ours["ops"]["ex2.approx.f32"] == fla_k["ops"]["ex2.approx.f32"] == 1
        assert ours["ops"].get("cvt.rn.bf16.f32", 0) > 0 and not any("cvt.rz" in op for op in ours["ops"])


def test_gnu_patch_gives_the_same_file(sglang_fork_trees, patched_trees, tmp_path):
    gnu = shutil.which("patch")
    if gnu is None:
        pytest.skip("GNU patch is not installed")
    for commit, src in sglang_fork_trees.items():
        work = tmp_path / commit
        (work / BACKEND).parent.mkdir(parents=True)
        shutil.copyfile(src / BACKEND, work / BACKEND)
        patch = P.patch_dir() / B.GLA_DECODE.patch
        proc = subprocess.run([gnu, "-p1", "--forward", "--batch", "-i", str(patch)], cwd=work,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (work / BACKEND).read_bytes() == (patched_trees[commit] / BACKEND).read_bytes(), commit


def test_the_gpu_script_rehearses_on_the_cpu(fla, tmp_path):
    """benchmarks/gpu_gla_decode.py --tiny under the interpreter: its identity rows are real checks (eager only:
    CUDA graphs and the timings need the GPU), its table prints, its JSON has every row."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = tmp_path / "gla.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_gla_decode.py"), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(r["batch"], r["live"], r["mode"]) for r in result["identity"]] == [(1, 1, "eager"), (4, 3, "eager")]
    assert all({r["outputs"], r["states"], r["untouched"]} == {"identical"} for r in result["identity"])
    assert [(r["batch"], r["path"]) for r in result["timing"]["rows"]] == [
        (1, "fork (fla W=4)"), (1, "inplace W=4"), (4, "fork (fla W=4)"), (4, "inplace W=4")]
    assert {round(r["x_fork_bytes"], 3) for r in result["timing"]["rows"] if r["path"].startswith("inplace")} == {0.333}
    assert "| W | batch | live | mode |" in proc.stdout and "the times are not" in proc.stdout
