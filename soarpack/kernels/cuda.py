"""The CUDA backend of `soarpack kernels` (and of benchmarks/gpu_w4_dispatch.py): random GPTQ tensors as soarpack
writes them, Marlin's layout from the fork's repack, and CUDA-graph timing that cycles weight copies past the L2.

The FP8 route is patch 05's own code (soarpack.kernels.block, fp8=True): the per-channel e4m3 copy made from
Marlin's layout as the patched server makes it at load (from the dequantized weight for a 16-bit shape, as the
fork's --quantization fp8 does), sgl_kernel's sgl_per_token_quant_fp8 + fp8_scaled_mm when `sgl_kernel` imports
(torch._scaled_mm otherwise: `describe()["fp8"]` says which).

Marlin: `sgl_kernel` when it imports (what the platform serves with), else the extension benchmarks/
build_marlin_ext.py builds (`marlin_ext`, a .so registering the same sgl_kernel ops). GPTQModel's Marlin is not
wired in: only soarpack/quant/engine.py may import gptqmodel. Not run on a GPU by the tests (no GPU there).
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

import torch
import torch.nn.functional as F

L2_BYTES = 256 << 20  # cycle weight copies until one graph touches this much (the H200's L2 is 60 MB)
WTYPE_ID = {4: 1125899907892224, 8: 1125899923621888}  # sglang scalar_types.uint4b8.id / uint8b128.id


def cuda_available() -> bool:
    return torch.cuda.is_available()


class Graph:
    """fns (called in turn) captured once in a CUDA graph; `time()` gives seconds per call of one fn."""

    def __init__(self, fns):
        for fn in fns:
            fn()
        torch.cuda.synchronize()
        self.n = len(fns)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for fn in fns:
                fn()
        self.graph.replay()
        torch.cuda.synchronize()
        self.iters = None

    def time(self, min_time: float = 0.02) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if self.iters is None:
            a.record()
            self.graph.replay()
            b.record()
            torch.cuda.synchronize()
            self.iters = max(3, min(200, int(min_time / max(a.elapsed_time(b) / 1000, 1e-7))))
        a.record()
        for _ in range(self.iters):
            self.graph.replay()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / 1000 / self.iters / self.n


def interleaved(graphs: dict, rounds: int = 3) -> dict:
    """Median seconds per call of each graph, timed in turn for `rounds` rounds (drift falls on every route)."""
    times = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, g in graphs.items():
            times[k].append(g.time())
    return {k: statistics.median(v) for k, v in times.items()}


def graph_time(fns) -> float:
    return interleaved({"x": Graph(fns)})["x"]


def device_ceilings(gib: int = 4) -> dict:
    """Read (torch.sum over `gib` GiB), copy (read + write) and bf16 GEMM rates, measured now."""
    n = gib << 28  # fp32 elements
    x = torch.randn(n, device="cuda", dtype=torch.float32)
    out = torch.empty((), device="cuda")
    t_read = graph_time([lambda: torch.sum(x, dim=0, out=out)])
    y = torch.empty(n // 2, device="cuda")
    src = x[: n // 2]
    t_copy = graph_time([lambda: y.copy_(src)])
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    bm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t_mm = graph_time([lambda: torch.matmul(a, bm)])
    res = {"read_GBps": n * 4 / t_read / 1e9, "copy_GBps": (n // 2) * 4 * 2 / t_copy / 1e9,
           "bf16_TFLOPs": 2 * 8192**3 / t_mm / 1e12}
    del x, y, a, bm
    torch.cuda.empty_cache()
    return res


def rel_err(out, ref) -> float:
    out = out.float()
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out - ref).norm() / ref.norm()).item()


def make_layer(size_n: int, size_k: int, bits: int, gen) -> dict:
    """Random GPTQ v1 tensors as soarpack writes them (sym, g128), on the GPU."""
    from soarpack.quant.gptq_format import dequantize

    pf, groups = 32 // bits, size_k // 128
    qweight = torch.randint(-2**31, 2**31 - 1, (size_k // pf, size_n), generator=gen, device="cuda", dtype=torch.int32)
    zero_word = {4: 0x77777777, 8: 0x7F7F7F7F}[bits]
    qzeros = torch.full((groups, size_n // pf), zero_word, device="cuda", dtype=torch.int32)
    scales = ((torch.rand(groups, size_n, generator=gen, device="cuda") * 0.02 + 0.002)
              .to(torch.bfloat16).to(torch.float16))  # exact in both
    g_idx = torch.arange(size_k, device="cuda", dtype=torch.int32) // 128
    w_ref = dequantize(qweight, qzeros, scales, g_idx, bits, 128, dtype=torch.float32)  # [n, k]
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx, "w_ref": w_ref}


def to_marlin(block, layer: dict, size_n: int, size_k: int, bits: int, have_marlin: bool = True) -> tuple:
    """(Marlin qweight, Marlin scales, whether the CUDA repack equals the patch's reference layout or None)."""
    from soarpack.quant.gptq_format import unpack_rows

    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    perm = torch.tensor(block._sp_scale_perm(), device="cuda", dtype=torch.long)
    sm = layer["scales"].to(torch.bfloat16).reshape(-1, 64)[:, perm].reshape(-1, size_n).contiguous()
    ref_layout = block.soarpack_marlin_reference_repack(unpack_rows(layer["qweight"], bits), bits)
    if not have_marlin:
        return ref_layout, sm, None
    qm = torch.ops.sgl_kernel.gptq_marlin_repack(layer["qweight"].contiguous(), empty, size_k, size_n, bits)
    return qm, sm, bool(torch.equal(qm, ref_layout))


def load_marlin(marlin_ext: Optional[str]) -> Optional[str]:
    """Register torch.ops.sgl_kernel.gptq_marlin_gemm; return which Marlin it is, or None."""
    try:
        import sgl_kernel  # noqa: F401  (registers the ops on import)

        if hasattr(torch.ops.sgl_kernel, "gptq_marlin_gemm"):
            return f"sgl_kernel {getattr(sgl_kernel, '__version__', '?')} (the image's)"
    except Exception:
        pass
    if marlin_ext:
        from pathlib import Path

        from soarpack.errors import ConfigError

        if not Path(marlin_ext).is_file():
            raise ConfigError(f"--marlin-ext {marlin_ext} does not exist",
                              "build it with benchmarks/build_marlin_ext.py, or leave it out to measure without Marlin")
        torch.ops.load_library(str(marlin_ext))
        return f"extension {marlin_ext} (benchmarks/build_marlin_ext.py)"
    return None


def fp8_ops() -> Optional[str]:
    """Which FP8 kernels the route runs: sgl_kernel's (registered when it imported) or torch._scaled_mm's."""
    names = ("fp8_scaled_mm", "sgl_per_token_quant_fp8")
    have = [n for n in names if hasattr(torch.ops.sgl_kernel, n)]
    if have == list(names):
        import sgl_kernel

        return f"sgl_kernel {getattr(sgl_kernel, '__version__', '?')}: sgl_per_token_quant_fp8 + fp8_scaled_mm"
    return "torch._scaled_mm rowwise + a torch per-token quantization (sgl_kernel lacks " + \
        ", ".join(n for n in names if n not in have) + ")"


class CudaBackend:
    def __init__(self, marlin_ext: Optional[str] = None, dispatch: Optional[str] = None, seed: int = 0,
                 fp8_spec: Optional[str] = None):
        from soarpack.kernels import w4_splitk
        from soarpack.kernels.block import load_dispatch_block

        torch.backends.cuda.matmul.allow_tf32 = False
        self.marlin = load_marlin(marlin_ext)
        self.block = load_dispatch_block(dispatch=dispatch, fp8=True, fp8_spec=fp8_spec)
        self.splitk = w4_splitk
        self.gen = torch.Generator(device="cuda").manual_seed(seed)
        self.checks = {}

    def describe(self) -> dict:
        return {"device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
                "torch": torch.__version__, "marlin": self.marlin, "triton": self.splitk.triton is not None,
                "fp8": fp8_ops(),
                "dispatch_thresholds": {f"{c}:{b}": v for (c, b), v in self.block.SOARPACK_W4_ACTIVE.items()},
                "fp8_thresholds": {f"{c}:{b}": v for (c, b), v in self.block.SOARPACK_FP8_ACTIVE.items()}}

    def ceilings(self) -> dict:
        return device_ceilings()

    def measure(self, size_n: int, size_k: int, bits: Optional[int], ms) -> dict:
        layer = make_layer(size_n, size_k, bits or 4, self.gen)
        w_bf16 = layer["w_ref"].to(torch.bfloat16)
        bf_copies = max(1, min(8, math.ceil(L2_BYTES / (w_bf16.numel() * 2))))
        wbs = [w_bf16] + [w_bf16.clone() for _ in range(bf_copies - 1)]
        fns = {"bf16": lambda x, c: F.linear(x, wbs[c % bf_copies])}
        copies = {"bf16": bf_copies}
        b = self.block
        fp8_copies = max(1, min(8, math.ceil(L2_BYTES / w_bf16.numel())))
        if bits:  # patch 05's copy, from Marlin's layout (below), as the patched server makes it at load
            f8s = None
        else:  # a 16-bit shape: the fork's --quantization fp8 quantizes the (bf16) weight per output channel
            q, s = b.soarpack_fp8_quantize_rows(w_bf16)
            f8s = [(q.t(), s.t().contiguous())] + [(q.clone().t(), s.t().contiguous()) for _ in range(fp8_copies - 1)]
        if bits:
            qm, sm, layout_ok = to_marlin(self.block, layer, size_n, size_k, bits, self.marlin is not None)
            self.checks[f"{size_n}x{size_k}:{bits}"] = {"marlin_layout_matches_reference": layout_ok}
            q_copies = max(1, min(8, math.ceil(L2_BYTES / (qm.numel() * 4 + sm.numel() * 2))))
            qms = [qm] + [qm.clone() for _ in range(q_copies - 1)]
            sms_ = [sm] + [sm.clone() for _ in range(q_copies - 1)]
            n_sm = torch.cuda.get_device_properties(0).multi_processor_count
            workspace = torch.zeros(n_sm, dtype=torch.int32, device="cuda")
            empty = torch.empty(0, dtype=torch.int32, device="cuda")
            wq, ws = b.soarpack_fp8_weight_copy(qm, sm, size_k, size_n, bits)
            f8s = [(wq, ws)] + [(wq.t().clone().t(), ws.clone()) for _ in range(fp8_copies - 1)]

            def via(route):
                return lambda x, c: b.soarpack_w4_gemm(x, qms[c], sms_[c], empty, empty, empty, workspace, WTYPE_ID[bits],
                                                       bits, size_n, size_k, True, False, True, route=route)

            fns["dequant"] = via("dequant")
            if self.marlin:
                fns["marlin"], fns["dispatch"] = via("marlin"), via(None)
            if self.splitk.triton is not None and bits == 4:
                fns["splitk"] = lambda x, c: self.splitk.w4_splitk_gemm(x, qms[c], sms_[c], size_n, size_k)
            for rt in fns:
                copies.setdefault(rt, q_copies)

            def fp8_via(route):
                return lambda x, c: b.soarpack_fp8_gemm(
                    x, f8s[c % fp8_copies][0], f8s[c % fp8_copies][1], qms[c % q_copies], sms_[c % q_copies], empty,
                    empty, empty, workspace, WTYPE_ID[bits], bits, size_n, size_k, True, False, True, route=route)

            if self.marlin:  # below the FP8 threshold the patch's op calls Marlin
                fns["fp8_dispatch"] = fp8_via(None)
                copies["fp8_dispatch"] = max(q_copies, fp8_copies)
        fns["fp8"] = lambda x, c: b.soarpack_fp8_linear(x, *f8s[c % fp8_copies])
        fns["fp8_torch"] = lambda x, c: b.soarpack_fp8_linear(x, *f8s[c % fp8_copies], gemm="torch")
        copies["fp8"] = copies["fp8_torch"] = fp8_copies
        out = {}
        for m in ms:
            x = torch.randn(m, size_k, generator=self.gen, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ layer["w_ref"].t()
            row, graphs = {}, {}
            for rt, fn in fns.items():
                if rt == "splitk" and not self.splitk.supports(m, size_n, size_k, bits):
                    continue
                try:
                    row[f"{rt}_err"] = rel_err(fn(x, 0), ref)
                    graphs[rt] = Graph([(lambda c=c, fn=fn: fn(x, c)) for c in range(copies[rt])])
                except Exception as exc:  # a failing route is a finding; keep the others
                    row[f"{rt}_error"] = repr(exc)[:300]
            # the FP8 route's two parts: the activations' quantization alone, and the GEMM on quantized activations
            try:
                x_q, x_s = b.soarpack_fp8_quant_act(x)
                graphs["fp8_quant"] = Graph([lambda: b.soarpack_fp8_quant_act(x)])
                gemm = b._sp_sgl_op("fp8_scaled_mm")
                if gemm is not None:
                    graphs["fp8_gemm"] = Graph([(lambda c=c: gemm(x_q, *f8s[c], x.dtype, None)) for c in range(fp8_copies)])
                # the numerics issue 37 asks for: against the bf16 matmul of the same dequantized weight (like for
                # like), beside the error of the fork's --quantization fp8 recipe on that weight rounded to bf16
                bf = F.linear(x, w_bf16).float()
                row["fp8_vs_bf16mm_err"] = rel_err(fns["fp8"](x, 0), bf)
                fq, fs = b.soarpack_fp8_quantize_rows(w_bf16)
                row["fork_fp8_vs_bf16mm_err"] = rel_err(b.soarpack_fp8_linear(x, fq.t(), fs.t().contiguous()), bf)
                row["fork_fp8_err"] = rel_err(b.soarpack_fp8_linear(x, fq.t(), fs.t().contiguous()), ref)
                del bf, fq, fs
            except Exception as exc:  # a failing part is a finding; keep the others
                row["fp8_parts_error"] = repr(exc)[:300]
            times = interleaved(graphs)
            del graphs, ref
            for rt, t in times.items():
                row[f"{rt}_us"] = t * 1e6
            if bits:
                row["dispatch_route"] = self.block.soarpack_w4_route(m, size_n, size_k, bits)
                row["fp8_route"] = self.block.soarpack_fp8_route(m, size_n, size_k, bits)
            out[m] = row
        del layer, wbs, w_bf16, fns, f8s
        torch.cuda.empty_cache()
        return out
