"""GPTQ's Hessian products on a GPU: GPTQModel's float32 XᵀX against soarpack's bf16 GEMM accumulating in float32.

    python benchmarks/gpu_hessian.py [--tokens 8192] [--columns 4096,16384] [--json out.json]

For each width (4096: q/k/v, o, gate/up inputs; 16384: down_proj's input) X is one calibration batch of bf16
activations (tokens × columns, unit variance with a few outlier channels, as after an RMSNorm and in an MLP).
- "fp32 SGEMM (GPTQModel)": X upcast to float32, `X.T @ X` with TF32 off, as GPTQModel's quantization loop runs it;
- "bf16 GEMM, fp32 out (soarpack)": `torch.mm(X.T, X, out_dtype=torch.float32)` (soarpack.quant.engine);
- reference: X in float64.
Relative error = ||H - ref|| / ||ref||; time is the median of 5 CUDA-event timings after 2 warm-ups, and the last
column scales it to one layer's Hessians for 320,067 calibration tokens (the 256 built-in rows; soarpack forms one
Hessian per shared input: 3 of width 4096 and 1 of 16384 a layer). Prints one table.
"""

from __future__ import annotations

import argparse
import json

import torch
from gpu_gla import cuda_time  # this folder is on sys.path when the script runs

LAYER_TOKENS = 320_067
HESSIANS_PER_LAYER = {4096: 3, 16384: 1}


def activations(tokens: int, columns: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(columns)
    x = torch.randn(tokens, columns, device="cuda", generator=gen)
    x[:, :8] *= 20  # outlier channels
    return x.to(torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--columns", default="4096,16384")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # as GPTQModel's tf32_high_precision_guard
    rows = []
    for columns in (int(c) for c in args.columns.split(",")):
        x = activations(args.tokens, columns)
        ref = x.double().T @ x.double()

        def fp32_sgemm():
            x32 = x.to(torch.float32)
            return x32.T @ x32

        def bf16_gemm():
            return torch.mm(x.T, x, out_dtype=torch.float32)

        for name, fn in (("fp32 SGEMM (GPTQModel)", fp32_sgemm), ("bf16 GEMM, fp32 out (soarpack)", bf16_gemm)):
            h = fn()
            err = ((h.double() - ref).norm() / ref.norm()).item()
            t = cuda_time(fn)
            per_layer = t * LAYER_TOKENS / args.tokens * HESSIANS_PER_LAYER.get(columns, 1)
            rows.append({"columns": columns, "tokens": args.tokens, "impl": name, "rel_err": err, "seconds": t,
                         "tflops": 2 * args.tokens * columns**2 / t / 1e12, "per_layer_s": per_layer})
            del h
        del x, ref
        torch.cuda.empty_cache()
    print(f"{'columns':>7} {'impl':>31} {'rel err':>9} {'ms':>8} {'TFLOP/s':>8} {'s a layer':>10}")
    for r in rows:
        print(f"{r['columns']:>7} {r['impl']:>31} {r['rel_err']:>9.2e} {r['seconds'] * 1e3:>8.2f} {r['tflops']:>8.1f} "
              f"{r['per_layer_s']:>10.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
