"""GLA agreement on a GPU: soarpack.sala's torch simple-GLA against fla's kernels, both against float64.

    python benchmarks/gpu_gla.py [--lengths 1,63,64,2048,8192] [--batch 1] [--dtypes bf16,fp32]
                                 [--impls torch,fla-chunk,fla-recurrent] [--heads 32] [--json out.json]

For each length and input dtype (bf16, fp32), at a full-size Lightning layer's shape (32 heads × 128), with inputs
shaped like the model's (q, k after RMSNorm: unit RMS per head; v: unit variance):
- ref: the exact recurrence in float64 (soarpack's chunked form in float64 equals the step-by-step loop to 1e-10,
  tests/test_sala_gla.py);
- torch: soarpack's path (inputs cast to float32, chunked form; the recurrent form for T = 1);
- fla chunk: `chunk_simple_gla`; fla recurrent: `fused_recurrent_simple_gla`, on the inputs in the given dtype.
Relative error = ||o - ref|| / ||ref|| over the whole output (and the final state), and tokens/s (CUDA events,
median of 5 after 2 warm-ups). Prints one table.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from soarpack.sala import gla
from soarpack.sala.config import alibi_slopes


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


def cuda_time(fn, warmup: int = 2, runs: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


def inputs(B: int, T: int, H: int, D: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.float64)
    k = torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.float64)
    v = torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.float64)
    q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True))
    k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True))
    return q, k, v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1,63,64,2048,8192")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1, help="rows per call (calibration forwards run 4)")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--impls", default="torch,fla-chunk,fla-recurrent")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

    H, D, B = args.heads, args.dim, args.batch
    dtypes = [{"bf16": torch.bfloat16, "fp32": torch.float32}[d] for d in args.dtypes.split(",")]
    impls = set(args.impls.split(","))
    scale = D**-0.5
    g64 = -torch.tensor(alibi_slopes(H), dtype=torch.float64, device="cuda")
    gla.set_backend("torch")
    rows = []
    for T in (int(x) for x in args.lengths.split(",")):
        q64, k64, v64 = inputs(B, T, H, D, seed=T)
        ref, ref_state = gla.chunk_gla(q64, k64, v64, g64, scale)
        for dtype in dtypes:
            q, k, v = (x.to(dtype) for x in (q64, k64, v64))
            gates = g64.to(torch.float32).view(1, 1, H).expand(B, T, H).contiguous()

            def ours():
                return gla.gla(q.float(), k.float(), v.float(), g64.float(), scale)

            def fla_chunk():
                return chunk_simple_gla(q, k, v, g=gates, scale=scale, output_final_state=True)

            def fla_rec():
                return fused_recurrent_simple_gla(q, k, v, g=gates, scale=scale, output_final_state=True)

            for key, name, fn in (("torch", "torch (soarpack)", ours), ("fla-chunk", "fla chunk", fla_chunk),
                                  ("fla-recurrent", "fla fused_recurrent", fla_rec)):
                if key not in impls:
                    continue
                try:
                    o, s = fn()
                    t = cuda_time(fn)
                    rows.append({"T": T, "batch": B, "dtype": str(dtype).replace("torch.", ""), "impl": name,
                                 "rel_err_out": rel(o, ref), "rel_err_state": rel(s, ref_state),
                                 "tok_per_s": B * T / t})
                except Exception as exc:  # report, don't hide: a kernel that refuses a shape is a finding
                    rows.append({"T": T, "dtype": str(dtype).replace("torch.", ""), "impl": name, "error": repr(exc)[:200]})
    print(f"{'T':>6} {'dtype':>9} {'impl':>22} {'rel err out':>12} {'rel err state':>14} {'tokens/s':>14}")
    for r in rows:
        if "error" in r:
            print(f"{r['T']:>6} {r['dtype']:>9} {r['impl']:>22}  ERROR {r['error']}")
        else:
            print(f"{r['T']:>6} {r['dtype']:>9} {r['impl']:>22} {r['rel_err_out']:>12.2e} {r['rel_err_state']:>14.2e} {r['tok_per_s']:>14,.0f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
