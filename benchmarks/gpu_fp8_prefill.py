"""Issue 37's per-linear numerics of patch 05's FP8 route, beside the fork's own --quantization fp8 linear, and the
tables of RESULTS.md §10 (numerics, and the kernel table `soarpack kernels` wrote).

    python benchmarks/gpu_fp8_prefill.py numerics --fork PATCHED/python --json numerics.json    # on the device
    python benchmarks/gpu_fp8_prefill.py numerics --device cpu --shapes 256x512 --m 4,64 --json n.json  # CPU rehearsal
    python benchmarks/gpu_fp8_prefill.py render --numerics numerics.json --kernels kernels.json           # markdown

numerics: for every SALA linear shape at W4 (and W8 for the shapes w4-balanced keeps at W8), a Gaussian weight
quantized to GPTQ by round to nearest (group 128, symmetric: benchmarks/gpu_serve/compare.py rtn_gptq), in Marlin's
layout (the patch's reference repack, which tests/test_w4_dispatch.py holds equal to Marlin's), and at each M two
inputs (Gaussian; Gaussian with 1 % of the channels x 30, the outlier channels real activations have):
- bf16: the bf16 matmul of the dequantized weight, the reference the issue names (and its error to fp32);
- patch: patch 05's route as the patched tree has it (benchmarks/w4_dispatch_block.py, fp8=True): the per-channel
  e4m3 copy made from Marlin's layout, sgl_per_token_quant_fp8 + fp8_scaled_mm (torch._scaled_mm without sgl_kernel);
- fork: the fork's own --quantization fp8 on the same dequantized weight in bf16, with --fork: the weight through its
  `per_token_group_quant_fp8` as `Fp8LinearMethod.process_weights_after_loading` does, the call through
  `fp8_utils.apply_fp8_linear` (imported from the tree: the shim and the carried site on PYTHONPATH); without
  --fork the same recipe computed by the patch's functions ("fork-recipe", not the fork's code).
Each error is ||out - ref|| / ||ref||. Random weights: the figures say how FP8 rounds these shapes, not what it does to
SALA's accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the repo: soarpack
sys.path.insert(0, str(HERE / "gpu_serve"))  # compare.rtn_gptq

SHAPES = {"sparse_qkv": (4608, 4096), "attn": (4096, 4096), "lightning_qkv": (12288, 4096),
          "gate_up": (32768, 4096), "down": (4096, 16384)}
W8_CLASSES = ("sparse_qkv", "lightning_qkv", "attn")  # what w4-balanced keeps at W8
M_NUMERICS = (1, 32, 512, 4096, 8192)


def rel(out, ref) -> float:
    import torch

    out = out.float()
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out - ref.float()).norm() / ref.float().norm()).item()


def _shapes(spec):
    if not spec:
        return [(cls, n, k) for cls, (n, k) in SHAPES.items()]
    out = []
    for item in spec.split(","):
        n, k = (int(v) for v in item.lower().split("x"))
        out.append((next((c for c, s in SHAPES.items() if s == (n, k)), "other"), n, k))
    return out


def _fork_fp8(tree):
    """The fork's own functions: (quantize weight per channel, apply) as Fp8LinearMethod uses them."""
    sys.path.insert(0, str(tree))
    from sglang.srt.layers.quantization.fp8_kernel import per_token_group_quant_fp8
    from sglang.srt.layers.quantization.fp8_utils import apply_fp8_linear, cutlass_fp8_supported

    def quantize(w_bf16):  # Fp8LinearMethod.process_weights_after_loading, checkpoint not fp8-serialized
        qweight, scale = per_token_group_quant_fp8(w_bf16, w_bf16.shape[-1])
        return qweight.t(), scale.t().contiguous()

    def apply(x, w, s):
        return apply_fp8_linear(input=x, weight=w, weight_scale=s, input_scale=None, bias=None,
                                cutlass_fp8_supported=cutlass_fp8_supported(), use_per_token_if_dynamic=False)

    return quantize, apply, f"the fork's per_token_group_quant_fp8 + apply_fp8_linear ({tree})"


def cmd_numerics(a) -> int:
    import torch
    import torch.nn.functional as F

    from compare import rtn_gptq
    from soarpack.quant.gptq_format import dequantize, unpack_rows

    dev = torch.device(a.device)
    if a.fork:
        from w4_dispatch_block import load_block

        block = load_block(a.fork, fp8=True)
        fork_q, fork_apply, fork_what = _fork_fp8(Path(a.fork))
    else:
        from soarpack.kernels.block import load_dispatch_block

        block = load_dispatch_block(fp8=True)
        def fork_q(w_bf16):
            q, s = block.soarpack_fp8_quantize_rows(w_bf16)
            return q.t(), s.t().contiguous()

        fork_apply = block.soarpack_fp8_linear
        fork_what = "fork-recipe: the fork's per-channel + per-token recipe, computed by the patch's functions"
    if dev.type == "cuda":
        try:
            import sgl_kernel  # noqa: F401  (registers sgl_per_token_quant_fp8 and fp8_scaled_mm)
        except ImportError:
            pass
    gen = torch.Generator(device="cpu").manual_seed(a.seed)
    ms = [int(v) for v in a.m.split(",")] if a.m else list(M_NUMERICS)
    rows, t0 = [], time.monotonic()
    for cls, n, k in _shapes(a.shapes):
        for bits in (4, 8) if (cls in W8_CLASSES or a.shapes) else (4,):
            w = 0.02 * torch.randn(n, k, generator=gen)
            parts = {key: v.to(dev) for key, v in rtn_gptq(w, 128, bits).items()}
            w_deq = dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], bits, 128,
                               dtype=torch.float32)  # [n, k]
            w_bf16 = w_deq.to(torch.bfloat16)
            perm = torch.tensor(block._sp_scale_perm(), device=dev)
            marlin_s = parts["scales"].to(torch.bfloat16).reshape(-1, 64)[:, perm].reshape(-1, n)
            marlin_q = block.soarpack_marlin_reference_repack(unpack_rows(parts["qweight"], bits), bits)
            del parts
            p_w, p_s = block.soarpack_fp8_weight_copy(marlin_q, marlin_s, k, n, bits)
            f_w, f_s = fork_q(w_bf16)
            del marlin_q, marlin_s
            for m in ms:
                for inputs in ("gaussian", "outliers"):
                    x = torch.randn(m, k, generator=gen)
                    if inputs == "outliers":
                        x[:, torch.randperm(k, generator=gen)[: max(1, k // 100)]] *= 30.0
                    x = x.to(torch.bfloat16).to(dev)
                    ref = x.float() @ w_deq.t()
                    bf = F.linear(x, w_bf16)
                    patch = block.soarpack_fp8_linear(x, p_w, p_s)
                    fork = fork_apply(x, f_w, f_s)
                    rows.append({"class": cls, "shape": f"{n}x{k}", "bits": bits, "M": m, "inputs": inputs,
                                 "bf16_vs_fp32": rel(bf, ref), "patch_vs_bf16": rel(patch, bf),
                                 "fork_vs_bf16": rel(fork, bf), "patch_vs_fork": rel(patch, fork),
                                 "patch_vs_fp32": rel(patch, ref), "fork_vs_fp32": rel(fork, ref)})
                    del x, ref, bf, patch, fork
            del w_deq, w_bf16, p_w, p_s, f_w, f_s
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    res = {"what": "per-linear relative errors of patch 05's FP8 route and of the fork's --quantization fp8 linear",
           "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
           "fork": fork_what, "patch_ops": _ops(block, dev), "seconds": round(time.monotonic() - t0, 1),
           "rows": rows}
    text = json.dumps(res, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n", encoding="utf-8")
    print(render_numerics(res))
    return 0


def _ops(block, dev) -> str:
    if dev.type != "cuda":
        return "torch (CPU): torch._scaled_mm rowwise and the per-token quantization in torch"
    have = [n for n in ("sgl_per_token_quant_fp8", "fp8_scaled_mm") if block._sp_sgl_op(n) is not None]
    return "sgl_kernel: " + " + ".join(have) if have else "torch._scaled_mm rowwise (sgl_kernel's fp8 ops absent)"


def render_numerics(res: dict) -> str:
    lines = [f"numerics on {res['device']} (torch {res['torch']}); patch route: {res['patch_ops']}; fork: {res['fork']}",
             "", "| shape (class) | W | M | inputs | bf16 vs fp32 | patch vs bf16 | fork vs bf16 | patch vs fork |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['shape']} ({r['class']}) | {r['bits']} | {r['M']} | {r['inputs']} | {r['bf16_vs_fp32']:.2e} "
                     f"| {r['patch_vs_bf16']:.2e} | {r['fork_vs_bf16']:.2e} | {r['patch_vs_fork']:.2e} |")
    return "\n".join(lines)


def render_kernels(res: dict) -> str:
    """The FP8 table of a `soarpack kernels` JSON: per shape and M, bf16 / Marlin / dispatch / FP8 (quantization
    included) in µs, FP8's parts and ratio to bf16, the routes patches 04 + 05 take, and the bar."""
    from soarpack.kernels.measure import DECODE_BAR_M, route_of
    from soarpack.kernels.thresholds import NEVER

    th = {tuple(k.split(":")[:1]) + (int(k.split(":")[1]),): v for k, v in res["thresholds"].items()}
    f8 = {tuple(k.split(":")[:1]) + (int(k.split(":")[1]),): v for k, v in res.get("fp8_thresholds", {}).items()}
    d = res["device"]
    lines = [f"`soarpack kernels` on {d.get('device')} (torch {d.get('torch')}; Marlin: {d.get('marlin')}; FP8: "
             f"{d.get('fp8')})", "",
             "| shape (class) | W | M | bf16 µs | Marlin | dispatch (04) | FP8 route | of which quant | FP8 GEMM "
             "| FP8 / bf16 | torch._scaled_mm route | route 04+05 | winner |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt=".1f"):
        return "-" if v is None else format(v, fmt)

    for r in res["rows"]:
        route = route_of(r, th, f8) if r["bits"] in (4, 8) else "bf16"
        lines.append(f"| {r['shape']} ({r['class']}) | {r['bits']} | {r['M']} | {f(r.get('bf16_us'))} | "
                     f"{f(r.get('marlin_us'))} | {f(r.get('dispatch_us'))} | {f(r.get('fp8_us'))} | "
                     f"{f(r.get('fp8_quant_us'))} | {f(r.get('fp8_gemm_us'))} | {f(r.get('fp8_vs_bf16'), '.2f')} | "
                     f"{f(r.get('fp8_torch_us'))} | {route} | {r.get('winner') or '-'} |")
    bar = res.get("fp8_bar") or {}
    verdict = {True: "met", False: "NOT met", None: "not judged"}[bar.get("ok")]
    lines += ["", f"Bar (FP8 route <= {bar.get('ratio')}x bf16 at M = 4096 and 8192 on every shape; Marlin the route "
                  f"at M <= {DECODE_BAR_M}): **{verdict}**."]
    for s in bar.get("shapes", []):
        if not s["ok"]:
            lines.append(f"- {s['shape']} ({s['class']}) at M = {s['M']}: {s['fp8_vs_bf16']:.2f}x bf16")
    for x in bar.get("decode_not_marlin", []):
        lines.append(f"- {x['shape']} W{x['bits']} at M = {x['M']}: {x['route']}, not Marlin")
    shown = {k: ("never" if v >= NEVER else v) for k, v in res.get("fp8_thresholds", {}).items()}
    lines += ["", f"FP8 thresholds: {shown}", f"`SOARPACK_FP8_PREFILL={res.get('fp8_env')}`",
              f"`SOARPACK_W4_DISPATCH={res.get('dispatch_env')}`", "",
              "| workload | step | M | bf16 ms | chosen (04) | fp8_prefill (04+05) | fp8_all (--quantization fp8) |",
              "|---|---|---|---|---|---|---|"]
    for r in res.get("rollup", []):
        lines.append(f"| {r['workload']} | {r['step']} | {r['M']} | {f(r.get('bf16_ms'), '.2f')} | "
                     f"{f(r.get('chosen_vs_bf16'), '.2f')}x | {f(r.get('fp8_prefill_vs_bf16'), '.2f')}x | "
                     f"{f(r.get('fp8_all_vs_bf16'), '.2f')}x |")
    return "\n".join(lines)


def cmd_render(a) -> int:
    out = []
    if a.kernels:
        out.append(render_kernels(json.loads(Path(a.kernels).read_text())))
    if a.numerics:
        out.append(render_numerics(json.loads(Path(a.numerics).read_text())))
    print("\n\n".join(out))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("numerics")
    n.add_argument("--fork", help="a tree with patches 04 + 05 applied (its python/): the fork's own fp8 code is used")
    n.add_argument("--device", default="cuda")
    n.add_argument("--shapes", help="NxK,... (default: every SALA shape)")
    n.add_argument("--m", help="row counts (default 1,32,512,4096,8192)")
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--json")
    r = sub.add_parser("render")
    r.add_argument("--kernels", help="the JSON of `soarpack kernels -o`")
    r.add_argument("--numerics", help="the JSON of `numerics --json`")
    a = ap.parse_args(argv)
    return cmd_numerics(a) if a.cmd == "numerics" else cmd_render(a)


if __name__ == "__main__":
    raise SystemExit(main())
