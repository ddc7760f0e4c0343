"""Marlin correctness on a GPU: tensors written by `soarpack quantize`, through GPTQModel's real Marlin kernel.

    python benchmarks/gpu_marlin.py CKPT [--json F]

For one sparse and one Lightning layer of CKPT (every linear: SALA's shapes), each module's qweight / qzeros /
scales / g_idx go into `MarlinQuantLinear` (bf16, JIT-compiled there) and are compared with the bf16 matmul of the
weight soarpack dequantizes as GPTQ v1 (zero = stored + 1). At M = 1, 8, 32, 512 rows it reports the relative error
||marlin - ref|| / ||ref|| and the time of Marlin vs bf16 `torch.matmul` on the dequantized weight, each replayed from a CUDA graph
(ratio < 1 means Marlin is faster). A second pass rewrites qzeros to 0x88888888 (what a peer did): if Marlin's output does not move,
the kernel ignores qzeros under sym, and the v1 reading of 0x77777777 is the one that matches it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def cuda_time(fn, iters: int = 200) -> tuple[float, str]:
    """Seconds per call of the GPU work alone: replayed from a CUDA graph (as SGLang serves decode), so Python
    and launch overhead do not count; a plain loop when the call cannot be captured (then says so)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run, how = graph.replay, "graph"
    except Exception:
        torch.cuda.synchronize()
        run, how = fn, "loop"
    run()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        run()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1000 / iters, how


def marlin_module(parts: dict, in_f: int, out_f: int, bits: int, group: int):
    from gptqmodel.nn_modules.qlinear.marlin import MarlinLinear
    from gptqmodel.utils.backend import BACKEND

    mod = MarlinLinear(bits=bits, group_size=group, desc_act=False, sym=True, in_features=in_f,
                            out_features=out_f, bias=False, dtype=torch.bfloat16, backend=BACKEND.GPTQ_MARLIN)
    with torch.no_grad():
        mod.qweight.data = parts["qweight"].clone()
        mod.qzeros.data = parts["qzeros"].clone()
        mod.scales.data = parts["scales"].to(torch.bfloat16)
        mod.g_idx.data = parts["g_idx"].clone()
    mod = mod.cuda()
    mod.post_init()
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from soarpack.sala.checkpoint import iter_tensors
    from soarpack.sala.config import load_config

    cfg = load_config(args.ckpt)
    qc = cfg.raw["quantization_config"]
    bits, group = int(qc["bits"]), int(qc["group_size"])
    layers = [cfg.sparse_layer_ids[0], cfg.lightning_layer_ids[0]]
    modules = {f"model.layers.{i}.{m}": shape for i in layers for m, shape in cfg.linear_shapes(i).items()}
    wanted = {f"{m}.{p}" for m in modules for p in ("qweight", "qzeros", "scales", "g_idx")}
    parts: dict = {}
    for name, t in iter_tensors(args.ckpt, names=wanted, device="cuda"):
        module, _, part = name.rpartition(".")
        parts.setdefault(module, {})[part] = t
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for module, (out_f, in_f) in modules.items():
        try:
            rows.extend(check_module(module, parts[module], out_f, in_f, bits, group, gen))
        except Exception as exc:  # a refused shape is a finding, not a reason to lose the other rows
            print(f"{module}: ERROR {exc!r}"[:400])
    _print(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def check_module(module, p, out_f, in_f, bits, group, gen) -> list:
    from soarpack.quant.gptq_format import dequantize

    rows = []
    stored_zero = int(p["qzeros"].view(-1)[0].item()) & 0xFFFFFFFF
    w_v1 = dequantize(p["qweight"], p["qzeros"], p["scales"], p["g_idx"], bits, group, dtype=torch.bfloat16)
    mod = marlin_module(p, in_f, out_f, bits, group)
    p88 = dict(p, qzeros=torch.full_like(p["qzeros"], 0x88888888 - 2**32))
    mod88 = marlin_module(p88, in_f, out_f, bits, group)
    w_v1_88 = dequantize(p88["qweight"], p88["qzeros"], p88["scales"], p88["g_idx"], bits, group, dtype=torch.bfloat16)
    for m in (1, 8, 32, 512):
        x = torch.randn(m, in_f, generator=gen, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            ref = (x.float() @ w_v1.float().t())
            out = mod(x).float()
            out88 = mod88(x).float()
            (t_marlin, how_m), (t_dense, how_d) = cuda_time(lambda: mod(x)), cuda_time(lambda: torch.matmul(x, w_v1.t()))
        rows.append({
            "module": module.split("model.layers.")[1], "shape": f"{out_f}x{in_f}", "M": m,
            "stored_qzero": f"0x{stored_zero:08x}",
            "rel_err": ((out - ref).norm() / ref.norm()).item(),
            "qzeros_88_changes_marlin": ((out88 - out).abs().max().item()),
            "v1_reading_of_88_rel_err": ((out - x.float() @ w_v1_88.float().t()).norm() / ref.norm()).item(),
            "marlin_us": t_marlin * 1e6, "bf16_matmul_us": t_dense * 1e6, "ratio": t_marlin / t_dense,
            "timed_by": f"{how_m}/{how_d}",
        })
    return rows


def _print(rows) -> None:
    hdr = f"{'module':28} {'shape':>11} {'M':>4} {'rel err':>9} {'88 moves':>9} {'v1(88) err':>10} {'marlin us':>10} {'bf16 us':>9} {'ratio':>6} timed"
    print(hdr)
    for r in rows:
        print(f"{r['module']:28} {r['shape']:>11} {r['M']:>4} {r['rel_err']:>9.2e} {r['qzeros_88_changes_marlin']:>9.1e} "
              f"{r['v1_reading_of_88_rel_err']:>10.2e} {r['marlin_us']:>10.1f} {r['bf16_matmul_us']:>9.1f} {r['ratio']:>6.2f} {r['timed_by']}")


if __name__ == "__main__":
    main()
