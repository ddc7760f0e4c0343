"""On the device, before any server: the shimmed stack imports for real and Marlin answers through the fork's path.

    PYTHONPATH=shim:FORK:SITE python device_check.py --out check.json

1. imports rehearse_closure.DENSE_MODULES for real (sglang-kernel 0.4.5's sm90 common_ops, flashinfer 0.5.3, fla
   0.6.0, transformers 4.57.1, the shim), and lists who provides each name the shim added;
2. when SOARPACK_MARLIN_SO is set: the fork's own `apply_gptq_marlin_linear` (marlin_utils.py) on RTN GPTQ tensors
   (compare.rtn_gptq), repacked by the fork's `gptq_marlin_repack` through the shim, against x @ W_deq^T, for
   the three MLP shapes of one full-size layer at M = 1, 8 and 32 (bf16; relative error reported, bar 2e-2);
3. flashinfer's rope through the shim against the fork's own native rope (forward_native).
Exit 0 only when every step passed; one JSON report either way.
"""

import argparse
import importlib
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # the repo, for soarpack.quant.gptq_format
MLP_SHAPES = ((4096, 16384), (4096, 16384), (16384, 4096))  # (in, out): gate, up, down of MiniCPM-SALA
REL_BAR = 2e-2


def step_imports():
    from rehearse_closure import DENSE_MODULES

    t0 = time.monotonic()
    for name in DENSE_MODULES:
        importlib.import_module(name)
    kernel = sys.modules["sgl_kernel"]
    return {"seconds": round(time.monotonic() - t0, 1), "modules": len(DENSE_MODULES),
            "sgl_kernel_file": kernel.__file__, "shim_added": getattr(kernel, "__soarpack_shim_added__", None)}


def step_marlin():
    import torch

    from compare import rtn_gptq
    from soarpack.quant.gptq_format import dequantize
    from sglang.srt.layers.quantization import marlin_utils as mu
    from sglang.srt.layers.quantization.gptq import gptq_marlin_repack
    from sglang.srt.layers.quantization.utils import get_scalar_types

    _, scalar_types = get_scalar_types()
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for size_k, size_n in MLP_SHAPES:
        w = 0.02 * torch.randn(size_n, size_k, generator=gen)
        parts = {k: v.to(dev) for k, v in rtn_gptq(w, 128, 4).items()}
        w_deq = dequantize(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], 4, 128,
                           marlin=True, dtype=torch.bfloat16)
        empty = mu.marlin_make_empty_g_idx(dev)
        q_marlin = gptq_marlin_repack(parts["qweight"].contiguous(), empty, size_k, size_n, 4)
        s_marlin = mu.marlin_permute_scales(parts["scales"].to(torch.bfloat16), size_k, size_n, 128)
        workspace = mu.marlin_make_workspace(dev)
        for m in (1, 8, 32):
            x = torch.randn(m, size_k, device=dev, dtype=torch.bfloat16)
            out = mu.apply_gptq_marlin_linear(input=x, weight=q_marlin, weight_scale=s_marlin,
                                              weight_zp=mu.marlin_make_empty_zp(dev), g_idx=empty,
                                              g_idx_sort_indices=empty, workspace=workspace,
                                              wtype=scalar_types.uint4b8, output_size_per_partition=size_n,
                                              input_size_per_partition=size_k, is_k_full=True)
            want = x.float() @ w_deq.float().t()
            rel = float((out.float() - want).norm() / want.norm())
            rows.append({"k": size_k, "n": size_n, "m": m, "rel_err": rel, "ok": rel < REL_BAR})
    return {"rows": rows, "ok": all(r["ok"] for r in rows)}


class _UnsetArgs:
    def __getattr__(self, name):
        return None


def step_rope():
    import torch

    from sglang.srt import server_args as fork_server_args
    from sglang.srt.layers.rotary_embedding import get_rope

    if fork_server_args._global_server_args is None:
        # get_rope reads the server's global args (rl_on_policy_target) that only a running server sets: outside one,
        # every field it asks for reads as unset.
        fork_server_args._global_server_args = _UnsetArgs()
    rope = get_rope(128, rotary_dim=128, max_position=4096, base=10000, is_neox_style=True, dtype=torch.bfloat16)
    rope = rope.to("cuda")
    pos = torch.arange(64, device="cuda")
    rows = []
    # bf16 (flashinfer's kernel) and fp32 (SALA casts q and k to fp32 before its rope: the shim's torch path)
    for dtype, bar in ((torch.bfloat16, 5e-2), (torch.float32, 1e-5)):
        q = torch.randn(64, 32 * 128, device="cuda", dtype=dtype)
        k = torch.randn(64, 2 * 128, device="cuda", dtype=dtype)
        want_q, want_k = rope.forward_native(pos, q.clone(), k.clone())
        got_q, got_k = q.clone(), k.clone()
        out = rope.forward_cuda(pos, got_q, got_k)
        got_q, got_k = out if out is not None else (got_q, got_k)
        err = max(float((got_q.float() - want_q.float()).abs().max()),
                  float((got_k.float() - want_k.float()).abs().max()))
        rows.append({"dtype": str(dtype), "max_abs_err": err, "ok": err < bar})
    return {"rows": rows, "ok": all(r["ok"] for r in rows)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    report, ok = {}, True
    steps = [("imports", step_imports), ("rope", step_rope)]
    if os.environ.get("SOARPACK_MARLIN_SO"):
        steps.append(("marlin", step_marlin))
    else:
        report["marlin"] = {"ok": False, "skipped": "SOARPACK_MARLIN_SO is not set"}
    for name, fn in steps:
        try:
            report[name] = fn()
            ok = ok and report[name].get("ok", True)
        except BaseException as exc:  # noqa: BLE001 - each failure is the finding
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800], "trace": traceback.format_exc()[-3000:]}
            ok = False
    report["ok"] = ok
    with open(a.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1, default=str)
    print(json.dumps({k: (v.get("ok") if isinstance(v, dict) else v) for k, v in report.items()}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
