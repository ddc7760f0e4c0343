"""Quantization speed: soarpack's path vs GPTQModel's own defaults, same model, same calibration rows, one run.

    .venv/bin/python benchmarks/quantize.py [--rows 32] [--max-len 256] [--only tiny|wide] [--repeat 3]

For each model (the tiny test model, and a wider synthetic one) and each path, a fresh subprocess quantizes with
the same SALA definition and rows, and reports wall time, peak RSS and the per-phase breakdown
(forward, Hessian, solve, pack, save) from GPTQModel's region timer plus our save.

- soarpack: our definition with shared-input Hessians (`:in=` tags), batches of 4 rows, `offload_to_disk=False`,
  no RTN fallback, `pack_impl="gpu"` on CUDA, our finalize (tensors + config).
- gptqmodel-default: the plain SALA definition peers used (one Hessian per module), batch 1,
  `QuantizeConfig(bits, group_size, sym, desc_act)` with everything else at GPTQModel's defaults, then `model.save()`.
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
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    import torch

    from soarpack.quant.calib import load_calibration
    from soarpack.quant.recipe import load_recipe
    from soarpack.sala.checkpoint import load_model
    from soarpack.sala.config import load_config
    from soarpack.sala.hf import gptq_definition, wrap_for_hf

    t_start = time.perf_counter()
    config = load_config(model_dir)
    recipe = load_recipe("w4-full")
    calib = load_calibration(None, model_dir, rows=rows, max_len=max_len, seed=0)
    examples = [{"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)} for ids in calib]
    sala = load_model(model_dir, dtype=torch.bfloat16)
    hf = wrap_for_hf(sala)
    hf.seqlen = config.dense_len
    from gptqmodel import QuantizeConfig
    from gptqmodel.models._const import normalize_device

    if variant == "soarpack":
        from soarpack.quant.run import _gptqmodel_quant_config

        qcfg = _gptqmodel_quant_config(recipe, config, "cpu", offload_to_disk=False)
    else:
        qcfg = QuantizeConfig(bits=recipe.bits, group_size=recipe.group_size, sym=True, desc_act=False)
        qcfg.device = normalize_device("cpu")
    definition = gptq_definition(shared_input=variant == "soarpack")
    gm = definition(hf, quantized=False, quantize_config=qcfg, tokenizer=None, model_local_path=model_dir)
    t0 = time.perf_counter()
    from soarpack.quant.run import DEFAULT_BATCH

    gm.quantize(examples, batch_size=DEFAULT_BATCH if variant == "soarpack" else 1)
    t_gptq = time.perf_counter() - t0
    from soarpack.quant.run import _gptq_region_totals

    regions = _gptq_region_totals(gm)
    out = tempfile.mkdtemp(prefix=f"bench-{variant}-")
    t0 = time.perf_counter()
    save_error = None
    if variant == "soarpack":
        from soarpack.quant.finalize import collect_tensors, extract_quantized, quantization_config, write_config
        from soarpack.sala.checkpoint import iter_tensors, save_state_dict

        save_state_dict(collect_tensors(extract_quantized(sala), iter_tensors(model_dir)), out)
        write_config(Path(model_dir), Path(out), quantization_config(recipe, config))
    else:
        try:
            gm.save(out)
        except Exception as exc:  # GPTQModel's save expects a transformers checkpoint of its own
            save_error = f"{type(exc).__name__}: {str(exc)[:120]}"
    t_save = time.perf_counter() - t0
    return {
        "variant": variant,
        "wall_s": round(time.perf_counter() - t_start, 2),
        "gptq_s": round(t_gptq, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "phases": phases(regions, t_save),
        "save_error": save_error,
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
            if r.get("save_error"):
                print(f"       ({r['variant']} save failed: {r['save_error']})")


if __name__ == "__main__":
    main()
