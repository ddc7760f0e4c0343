"""Quantization speed: soarpack's path vs GPTQModel's own defaults, same model, same calibration rows, one run.

    .venv/bin/python benchmarks/quantize.py [--rows 32] [--max-len 256] [--only tiny|wide] [--repeat 3]

For each model (the tiny test model, and a wider synthetic one) and each path, a fresh subprocess runs the
production `soarpack.quant.run.quantize` (no KL report, no verify, no sanity bound) and reports wall time, peak RSS
and the per-phase breakdown (forward, Hessian, solve, pack, save) from GPTQModel's region timer plus our save.

- soarpack: the engine's own mode: shared-input Hessians (`:in=` tags), batches of 4 rows, `offload_to_disk=False`,
  no RTN fallback, `pack_impl="gpu"` on CUDA.
- gptqmodel-default: the engine's "gptqmodel-defaults" mode: the plain SALA definition peers used (one Hessian per
  module), batch 1, `QuantizeConfig(bits, group_size, sym, desc_act)` with everything else at GPTQModel's defaults
  but `offload_to_disk=False` (our finalize reads the packed tensors from memory; before, this path offloaded).
Both write the checkpoint with our finalize (GPTQModel's own `save()` expects a transformers checkpoint of its own).
Phase columns are GPTQModel's region totals, summed over its worker threads, so they can exceed the wall time.
Prints one table; the last column is soarpack / default wall time (target <= 0.5 on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {
    "tiny": dict(num_layers=4),
    "wide": dict(num_layers=4, hidden_size=1024, intermediate_size=2816, num_attention_heads=8, num_key_value_heads=2,
                 lightning_nh=8, vocab_size=2048),
}


def phases(regions: dict, save_s: float) -> dict:
    g = lambda *ks: round(sum(regions.get(k, 0.0) for k in ks), 2)  # noqa: E731
    return {
        "forward": g("capture_inputs", "pre_quant_forward", "post_quant_forward"),
        "hessian": g("forward_hook"),  # Hessian accumulation runs in the forward hooks
        "solve": g("process_quant", "hessian_inverse"),
        "pack": g("submodule_finalize_create", "submodule_finalize_pack", "submodule_finalize_offload"),
        "save": round(save_s, 2),
    }


def child(variant: str, model_dir: str, rows: int, max_len: int) -> dict:
    """One production `quantize` run: soarpack's engine mode, or the engine's GPTQModel-defaults mode."""
    from soarpack.quant.engine import ensure_supported
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize

    ensure_supported()  # imports GPTQModel (seconds) outside the timed region, as every variant did before

    out = Path(tempfile.mkdtemp(prefix=f"bench-{variant}-")) / "out"
    opts = quantize_options(recipe="w4-full", rows=rows, max_len=max_len, device="cpu", sanity_max_loss=None,
                            quality=False, verify=False, engine=variant.replace("gptqmodel-default", "gptqmodel-defaults"))
    t_start = time.perf_counter()
    result = quantize(model_dir, out, opts)
    return {
        "variant": variant,
        "wall_s": round(time.perf_counter() - t_start, 2),
        "gptq_s": round(result.timings["gptq"], 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "phases": phases(result.gptq_timings, result.timings["save"]),
    }


def run_child(variant: str, model_dir: Path, rows: int, max_len: int) -> dict:
    cmd = [sys.executable, __file__, "--child", variant, "--model", str(model_dir), "--rows", str(rows),
           "--max-len", str(max_len)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{\"variant\"")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{variant} on {model_dir} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--only", choices=sorted(MODELS))
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs per path; the fastest is shown")
    ap.add_argument("--child")
    ap.add_argument("--model")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.model, args.rows, args.max_len)))
        return
    from soarpack.sala.tiny import make_tiny_model

    rows_out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, kwargs in MODELS.items():
            if args.only and name != args.only:
                continue
            model_dir = make_tiny_model(Path(tmp) / name, **kwargs)
            # Interleaved repeats, best of each: this machine is shared and its timings drift.
            runs = {"soarpack": [], "gptqmodel-default": []}
            for _ in range(args.repeat):
                for variant in runs:
                    runs[variant].append(run_child(variant, model_dir, args.rows, args.max_len))
            ours, base = (min(runs[v], key=lambda r: r["wall_s"]) for v in runs)
            rows_out.append((name, ours, base))
    hdr = f"{'model':6} {'path':18} {'wall s':>7} {'gptq s':>7} {'RSS MiB':>8} {'fwd':>6} {'hess':>6} {'solve':>6} {'pack':>6} {'save':>6} {'ratio':>6}"
    print(f"rows={args.rows} max_len={args.max_len} recipe=w4-full cpu, best of {args.repeat}")
    print(hdr)
    for name, ours, base in rows_out:
        for r in (ours, base):
            p = r["phases"]
            ratio = f"{ours['wall_s'] / base['wall_s']:.2f}" if r is ours else ""
            print(f"{name:6} {r['variant']:18} {r['wall_s']:7.1f} {r['gptq_s']:7.1f} {r['peak_rss_mib']:8.0f} "
                  f"{p['forward']:6.1f} {p['hessian']:6.1f} {p['solve']:6.1f} {p['pack']:6.1f} {p['save']:6.1f} {ratio:>6}")


if __name__ == "__main__":
    main()
