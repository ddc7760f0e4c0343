"""Patch 06's decode step and the fork's own path, run from a patched tree's code on state pools of our making.

Shared by tests/test_gla_decode.py (CPU, Triton's interpreter) and benchmarks/gpu_gla_decode.py (the H200).

- `Forward(tree, mode)`: the patched tree's `SimpleGLAAttnBackend.forward` and `_get_mamba_indices`, compiled from
  the file's own text (at its line numbers) into a small class. Its globals are the patch's block as the tree has
  it (`soarpack_gla_decode_or_none`, `SOARPACK_GLA_DECODE_MODE` = mode) and fla-core's `fused_recurrent_simple_gla` /
  `chunk_simple_gla`, so mode "fork" runs the fork's lines unchanged: gather `temporal[mamba_indices]`, fla's
  fused recurrent kernel, scatter back. The instance holds what forward reads: `req_to_token_pool` (mamba_map,
  mamba_pool.mamba2_layer_cache(i).temporal), `forward_metadata` (mamba_cache_indices, query_start_loc),
  `g_gamma` (-ALiBi slopes), `scale`. Strict (the default): once the kernel has failed, forward raises rather than
  hand back the fork's output, which the patch falls back to, as the kernel's.
- `replay_metadata(slots, bs)`: the slot list and query_start_loc a CUDA-graph replay of batch size bs gives
  (`MambaAttnBackendBase._replay_metadata`): padded rows get slot -1 and an empty sequence.
- `Case`: the pools (one per layer, [S + 1, H, K, V]: the fork's MambaPool keeps one dummy slot at the end),
  a non-contiguous spread of slots, and per-step q/k/v as the model has them (views into one fused qkv row,
  q and k at unit RMS per head as after q_norm/k_norm).
- `force_fla_num_warps(n)`: fla autotunes its fused recurrent kernel between 4 and 8 warps; the partial outputs'
  reduction order depends on it, so a bit-for-bit comparison fixes both kernels to the same value (and Triton's
  CPU interpreter cannot benchmark at all).
"""

from __future__ import annotations

import __future__
import ast
import os
import shutil
import sys
import tarfile
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Optional, Sequence

import torch

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from soarpack.kernels.block import GLA_DECODE, file_block_source, load_block  # noqa: E402

BACKEND = "sglang/srt/layers/attention/hybrid_linear_attn_backend.py"
PATCH = "gla-decode-in-place"
METHODS = ("forward", "_get_mamba_indices")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# -- the patched tree ------------------------------------------------------------------------------------------


def patched_backend_file(src: os.PathLike, work: os.PathLike) -> Path:
    """The fork's hybrid_linear_attn_backend.py with patch 06 applied, under `work`.

    `src`: a pristine fork python/ dir (or its repository root), the fork's python tarball, or the pristine file
    alone. The patch is applied by soarpack's applier to a tree holding just that file."""
    from soarpack.serve.patches import apply_patches, resolve_src

    src, work = Path(src), Path(work)
    mini = work / "pristine" / "python"
    (mini / BACKEND).parent.mkdir(parents=True, exist_ok=True)
    if src.is_file() and src.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(src) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith("python/" + BACKEND))
            (mini / BACKEND).write_bytes(tar.extractfile(member).read())
    elif src.is_file():
        shutil.copyfile(src, mini / BACKEND)
    else:
        shutil.copyfile(resolve_src(src) / BACKEND, mini / BACKEND)
    out = work / "patched" / "python"
    apply_patches(mini, out, [PATCH])
    return out / BACKEND


def _methods_source(path: Path) -> Dict[str, tuple]:
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SimpleGLAAttnBackend"]
    lines = text.splitlines(keepends=True)
    out = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name in METHODS:
            first = node.lineno - len(node.decorator_list)
            out[node.name] = (first, "".join(lines[first - 1:node.end_lineno]))
    missing = set(METHODS) - set(out)
    if missing:
        raise ValueError(f"{path}: SimpleGLAAttnBackend has no {sorted(missing)}")
    return out


def load_fla():
    """fla-core's two entry points the fork imports (`from fla.ops.simple_gla import ...`)."""
    from fla.ops.simple_gla import chunk_simple_gla
    from fla.ops.simple_gla.fused_recurrent import fused_recurrent_simple_gla

    return fused_recurrent_simple_gla, chunk_simple_gla


def force_fla_num_warps(num_warps: Optional[int]):
    """Fix fla's fused recurrent forward kernel to one config (None: put its autotuned configs back)."""
    import triton
    import fla.ops.common.fused_recurrent as fr

    tuner = fr.fused_recurrent_fwd_kernel
    while not hasattr(tuner, "configs"):  # heuristics -> autotuner
        tuner = tuner.fn
    if not hasattr(tuner, "_soarpack_configs"):
        tuner._soarpack_configs = list(tuner.configs)
    tuner.configs = list(tuner._soarpack_configs) if num_warps is None else [triton.Config({}, num_warps=num_warps)]
    tuner.cache.clear()
    return tuner


class Forward:
    """The patched file's forward(), bound to a fake backend instance: call(q, k, v, batch, layer_id)."""

    def __init__(self, backend_file: Path, mode: str, fla=None, block=None, strict: bool = True):
        self.block = block if block is not None else load_block(
            GLA_DECODE, env_value=mode, source=file_block_source(backend_file, GLA_DECODE))
        if self.block.SOARPACK_GLA_DECODE_MODE != mode:
            raise ValueError(f"the block read mode {self.block.SOARPACK_GLA_DECODE_MODE!r}, not {mode!r}")
        fused, chunk = fla if fla is not None else load_fla()
        namespace = {"__name__": "soarpack_patched_backend", "torch": torch, "fused_recurrent_simple_gla": fused,
                     "chunk_simple_gla": chunk, "soarpack_gla_decode_or_none": self.block.soarpack_gla_decode_or_none,
                     "SOARPACK_GLA_DECODE_MODE": mode}
        for name, (first, text) in _methods_source(backend_file).items():
            code = compile("\n" * (first - 1) + textwrap.dedent(text), str(backend_file), "exec",
                           flags=__future__.annotations.compiler_flag, dont_inherit=True)
            exec(code, namespace)
        methods = {m: namespace[m] for m in METHODS}
        if strict:  # a kernel that failed hands the step to the fork's path: never let that pass as the kernel's output
            methods["forward"] = _strict(methods["forward"], self.block)
        self.cls = type("SimpleGLAAttnBackendUnderTest", (), methods)
        self.mode = mode

    def backend(self, pools: Sequence[torch.Tensor], layer_ids: Sequence[int], g_gamma: torch.Tensor, scale: float):
        obj = self.cls()
        caches = [SimpleNamespace(temporal=p) for p in pools]
        obj.req_to_token_pool = SimpleNamespace(
            mamba_map={layer: i for i, layer in enumerate(layer_ids)},
            mamba_pool=SimpleNamespace(mamba2_layer_cache=lambda i: caches[i]),
            get_mamba_indices=lambda req_pool_indices: _unused("get_mamba_indices"))
        obj.forward_metadata = None
        obj.g_gamma, obj.scale = g_gamma, scale
        return obj


def _strict(forward, block):
    def checked(obj, *args, **kwargs):
        out = forward(obj, *args, **kwargs)
        if block.SOARPACK_GLA_DECODE_FAILED:
            raise RuntimeError(f"the in-place kernel failed and the fork's path answered: {block.SOARPACK_GLA_DECODE_FAILED[0]}")
        return out
    return checked


def _unused(name):
    raise AssertionError(f"{name} was called: forward_metadata should have answered")


class Mode:
    def __init__(self, decode: bool):
        self.decode = decode

    def is_decode(self) -> bool:
        return self.decode


def decode_batch():
    return SimpleNamespace(forward_mode=Mode(True), extend_seq_lens=None, extend_prefix_lens=None)


def replay_metadata(live_slots: Sequence[int], bs: int, device) -> tuple:
    """(mamba_cache_indices, query_start_loc) of a graph replay at batch size bs with these live requests first."""
    n = len(live_slots)
    slots = torch.tensor(list(live_slots) + [-1] * (bs - n), dtype=torch.int32, device=device)
    qsl = torch.tensor(list(range(n + 1)) + [n] * (bs - n), dtype=torch.int32, device=device)
    return slots, qsl


def set_metadata(obj, slots: torch.Tensor, qsl: torch.Tensor) -> None:
    obj.forward_metadata = SimpleNamespace(mamba_cache_indices=slots, query_start_loc=qsl)


# -- inputs ------------------------------------------------------------------------------------------------------


def alibi_g_gamma(heads: int, total: int = 32) -> torch.Tensor:
    """-slope_h for `heads` of SALA's 32 Lightning heads, spread from the fastest to the slowest decay."""
    ratio = 2.0 ** (-8.0 / total)
    picks = [round(i * (total - 1) / max(1, heads - 1)) for i in range(heads)]
    return torch.tensor([-(ratio ** (p + 1)) for p in picks], dtype=torch.float32)


@dataclass
class Case:
    batch: int  # the captured batch size (rows of q)
    live: int  # requests in it; the rest are padded rows (slot -1)
    heads: int
    dim: int
    slots_total: int  # S: the pool's slots, plus one dummy slot
    layers: int = 1
    seed: int = 0
    device: str = "cpu"
    dtype: torch.dtype = torch.bfloat16
    state_dtype: torch.dtype = torch.float32

    def __post_init__(self):
        gen = torch.Generator().manual_seed(self.seed)
        self.gen = gen  # slots and q/k/v, drawn here; the pools on the device (24 layers at batch 32: 2.4 GB)
        perm = torch.randperm(self.slots_total, generator=gen)[: self.live]
        self.live_slots: List[int] = perm.tolist()  # a spread over the pool, in no order
        shape = (self.slots_total + 1, self.heads, self.dim, self.dim)
        pool_gen = torch.Generator(device=self.device).manual_seed(self.seed)
        self.initial = [(torch.randn(shape, generator=pool_gen, device=self.device) * 0.5).to(self.state_dtype)
                        for _ in range(self.layers)]
        self.g_gamma = alibi_g_gamma(self.heads).to(self.device)
        self.scale = self.dim ** -0.5

    def pools(self) -> List[torch.Tensor]:
        return [p.clone() for p in self.initial]

    def fused_qkv(self) -> torch.Tensor:
        """One step's qkv_proj output [batch, 3 * H * D] (q and k at unit RMS per head, as after q_norm/k_norm)."""
        raw = torch.randn(self.batch, 3, self.heads, self.dim, generator=self.gen)
        raw[:, :2] = raw[:, :2] * torch.rsqrt(raw[:, :2].pow(2).mean(-1, keepdim=True))
        return raw.reshape(self.batch, 3 * self.heads * self.dim).to(self.dtype).to(self.device)

    def split(self, fused: torch.Tensor):
        """q, k, v [1, batch, H, D] as the model makes them: views into the fused row (v is not contiguous)."""
        q, k, v = fused.split(self.heads * self.dim, dim=-1)
        return tuple(x.reshape(-1, self.heads, self.dim).unsqueeze(0) for x in (q, k, v))

    def qkv(self):
        return self.split(self.fused_qkv())


def step_pair(inplace, fork, q, k, v, layer: int):
    """One decode step through both backends: (the in-place output, the fork's output to compare it with bit for bit).

    Under Triton's interpreter with bf16 activations the fork's path gets the same values upcast to float32 (fla
    upcasts every load: the same arithmetic) and its float32 output is rounded as the interpreter rounds."""
    got = inplace.forward(q, k, v, decode_batch(), layer)
    if interpreting() and q.dtype != torch.float32:
        want = fork.forward(q.float(), k.float(), v.float(), decode_batch(), layer)
        return got, interpreter_round(want, q.dtype)
    return got, fork.forward(q, k, v, decode_batch(), layer)


def reference_step(state: torch.Tensor, q, k, v, g_gamma, scale):
    """The recurrence in float64 for rows [N, H, K, V]: S = exp(g) S + k^T v, o = scale q S."""
    s = state.double() * torch.exp(g_gamma.double())[None, :, None, None]
    s = s + k[0].double()[..., :, None] * v[0].double()[..., None, :]
    o = scale * torch.einsum("nhk,nhkv->nhv", q[0].double(), s)
    return s, o


def interpreter_round(x32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What Triton's CPU interpreter stores for a float32 -> dtype `.to()`: it truncates to bf16 (GPU code rounds to
    nearest, as torch does). Exact for bf16; other dtypes round as torch does."""
    if dtype == torch.bfloat16:
        return (x32.contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    return x32.to(dtype)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def first_difference(a: torch.Tensor, b: torch.Tensor) -> str:
    """'' when a and b are bit-identical, else how many elements differ, the first, and the largest difference."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    differ = _bits(a) != _bits(b)
    if not bool(differ.any()):
        return ""
    idx = tuple(int(i) for i in differ.nonzero()[0])
    return (f"{int(differ.sum())} of {differ.numel()} differ; first at {idx}: {a[idx].item()!r} vs {b[idx].item()!r}; "
            f"max |diff| {(a.double() - b.double()).abs().max().item():.3g}")


def state_bytes(heads: int, dim: int, itemsize: int = 4) -> int:
    """Bytes of one request's state in one layer (32 x 128 x 128 x 4 = 2 MiB for SALA)."""
    return heads * dim * dim * itemsize


def tmpdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))


# -- what Triton makes of both kernels for the H200 and the platform's GPU (compiled here, not interpreted) ------

SM90_OPS = ("fma.rn.f32", "mul.f32", "add.f32", "ex2.approx.f32", "ex2.approx.ftz.f32", "shfl.sync.bfly.b32",
            "bar.sync", "cvt.rn.bf16.f32", "cvt.rz.bf16.f32", "ld.global.v4.b32", "st.global.v4.b32",
            "ld.global.b16", "st.global.b16")


def _summary(kernel) -> dict:
    import re

    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    # Float lanes per operation: Blackwell's packed f32x2 forms (sm_100 and up) count twice, so sm_90's and sm_120's
    # code can be set side by side.
    lanes: Dict[str, int] = {}
    for op, packed in re.findall(r"^\s+((?:fma\.rn|mul|add)\.f32)(x2)?\b", ptx, re.M):
        lanes[op] = lanes.get(op, 0) + (2 if packed else 1)
    return {
        "layouts": [line.strip() for line in ttgir.splitlines() if line.startswith("#blocked")],
        "reduce_operands": re.findall(r"\}\) : \(tensor<([^>]*)>\) -> ", ttgir),
        "ops": {op: n for op in SM90_OPS if (n := len(re.findall(r"\b" + re.escape(op) + r"\b", ptx)))},
        "f32_lanes": lanes,
    }


def cuda_codegen(num_warps: Sequence[int] = (4, 8), dim: int = 128, heads: int = 32, arch: int = 90) -> dict:
    """{num_warps: {"fla": summary, "inplace": summary}}: fla's fused recurrent forward kernel as the fork calls
    it for decode (varlen, g_gamma, initial and final state, bf16 q/k/v) and patch 06's kernel (bf16 q/k/v/o,
    float32 pool, int32 slots), compiled for sm_ARCH (90: the H200; 120: the platform's Blackwell) by the installed
    Triton, down to a cubin by its ptxas. Must run with TRITON_INTERPRET unset."""
    if interpreting():
        raise RuntimeError("cuda_codegen compiles GPU code: run it with TRITON_INTERPRET unset")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import fla.ops.common.fused_recurrent as fr
    from soarpack.kernels.block import load_gla_decode_block

    ours = load_gla_decode_block(mode="")._soarpack_gla_decode_kernel
    from triton.runtime.jit import JITFunction

    theirs = fr.fused_recurrent_fwd_kernel
    while not isinstance(theirs, JITFunction):  # heuristics -> autotuner -> the jit function
        theirs = theirs.fn
    target, aligned = GPUTarget("cuda", arch, 32), [["tt.divisibility", 16]]
    tile = 64

    def compile_(fn, sig, consts, div, nw):
        sig = dict(sig, **{c: "constexpr" for c in consts})
        attrs = {(fn.arg_names.index(a),): aligned for a in div}
        return triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=target,
                              options={"num_warps": nw})

    fla_sig = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "g_gamma": "*fp32", "o": "*fp32", "h0": "*fp32",
               "ht": "*fp32", "cu_seqlens": "*i32", "scale": "fp32", "B": "i32", "T": "i32"}
    fla_consts = {"g": None, "gk": None, "gv": None, "H": heads, "K": dim, "V": dim, "BK": tile, "BV": tile,
                  "REVERSE": False, "USE_G": False, "USE_G_GAMMA": True, "USE_GK": False, "USE_GV": False,
                  "USE_INITIAL_STATE": True, "STORE_FINAL_STATE": True, "IS_VARLEN": True, "STATE_V_FIRST": False}
    strides = ["stride_qn", "stride_qh", "stride_kn", "stride_kh", "stride_vn", "stride_vh", "stride_on", "stride_oh",
               "stride_slot"]
    our_sig = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "o": "*bf16", "state": "*fp32", "slots": "*i32",
               "g_gamma": "*fp32", "scale": "fp32", **{s: "i32" for s in strides}}
    our_consts = {"H": heads, "K": dim, "V": dim, "BK": tile, "BV": tile, "NK": dim // tile, "NV": dim // tile,
                  "FAST_EXP": False}
    out = {}
    for nw in num_warps:
        out[str(nw)] = {
            "fla": _summary(compile_(theirs, fla_sig, fla_consts, [a for a in fla_sig if fla_sig[a].startswith("*")], nw)),
            "inplace": _summary(compile_(ours, our_sig, our_consts,
                                         [a for a in our_sig if our_sig[a].startswith("*")] + strides, nw)),
        }
    return out


if __name__ == "__main__":  # python benchmarks/gla_decode_harness.py sm90|sm120 [4,8]: one JSON line
    import json

    if len(sys.argv) < 2 or sys.argv[1] not in ("sm90", "sm120"):
        raise SystemExit("usage: gla_decode_harness.py sm90|sm120 [NUM_WARPS,...]")
    warps = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "4,8").split(",")]
    import triton

    # The Triton that compiled it rides along as a key of its own: a caller that puts the platform's Triton first on
    # PYTHONPATH checks it got that one.
    print(json.dumps({**cuda_codegen(warps, arch=int(sys.argv[1][2:])), "triton": triton.__version__}))
