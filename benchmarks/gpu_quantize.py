"""Full-width quantization on a GPU through the production path, or through GPTQModel's defaults for comparison.

    python benchmarks/gpu_quantize.py --work /tmp/fq [--layers 8] [--path soarpack|gptqmodel-default] [--json F]

Builds a synthetic MiniCPM-SALA with the release's shapes (hidden 4096, MLP 16384, 32/2 sparse heads, 32 Lightning
heads, vocab 73448; random bf16 weights, seeded, made on the GPU) with `--layers` layers in the release's 1:3
sparse:Lightning ratio, and the tiny model's tokenizer. Then:
- `--path soarpack`: `soarpack.quant.run.quantize` exactly as `soarpack quantize` runs it (recipe w4-full, 256
  built-in calibration rows up to 2048 tokens, damp 0.05, batch 4, shared-input Hessians, offload_to_disk=False,
  sanity bound off because the weights are random) and prints its phases;
- `--path gptqmodel-default`: the same `quantize` with the engine's "gptqmodel-defaults" mode: a plain SALA
  definition and `QuantizeConfig(bits=4, group_size=128, sym=True, desc_act=False)` with every other setting at
  GPTQModel's defaults but offload_to_disk, batch 1 (no KL report, no verify); our finalize writes the checkpoint.
Peak GPU memory is torch's max_memory_allocated; peak host memory is VmHWM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def hwm_gib() -> float:
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) / 2**20


def build_model(work: Path, layers: int, device: str, shape: str, seed: int = 0) -> Path:
    from soarpack.sala.checkpoint import save_state_dict
    from soarpack.sala.config import LIGHTNING, SPARSE, SalaConfig
    from soarpack.sala.release import release_config_dict
    from soarpack.sala.tiny import make_tiny_model

    model = work / f"sala-{shape}-{layers}L"
    if (model / "config.json").exists():
        return model
    tiny = make_tiny_model(work / "tiny-tok", force=True)
    raw = release_config_dict()
    if shape == "tiny":  # a CPU smoke test of this script
        raw = json.loads((tiny / "config.json").read_text())
    mixers = [SPARSE if i % 4 == 0 else LIGHTNING for i in range(layers)]
    raw.update(num_hidden_layers=layers, mixer_types=mixers)
    cfg = SalaConfig.from_dict(raw)
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, shape in sorted(cfg.tensor_shapes().items()):
        if len(shape) == 1:
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, device=device)
        else:
            t = 0.02 * torch.randn(shape, generator=gen, device=device)
        tensors[name] = t.to(torch.bfloat16).cpu()
    tmp = work / "building"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_state_dict(tensors, tmp, max_shard_bytes=2 << 30)
    (tmp / "config.json").write_text(json.dumps(raw, indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        shutil.copy(tiny / f, tmp / f)
    tmp.rename(model)
    return model


def run_quantize(model: Path, out: Path, device: str, engine: str) -> dict:
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize

    opts = quantize_options(recipe="w4-full", rows=256, max_len=2048, device=device, force=True, sanity_max_loss=None,
                            log_file=out.parent / "quantize.log", engine=engine,
                            quality=engine == "soarpack", verify=engine == "soarpack")
    t0 = time.perf_counter()
    res = quantize(model, out, opts)
    return {"wall_s": time.perf_counter() - t0, "phases_s": res.timings, "gptq_regions_s": res.gptq_timings,
            "quantized_modules": res.quantized_modules, "rows": res.rows, "kl": res.quality.get("kl")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--path", choices=("soarpack", "gptqmodel-default"), default="soarpack")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=("release", "tiny"), default="release")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = build_model(args.work, args.layers, args.device, args.shape)
    build_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    out = args.work / f"out-{args.path}"
    result = run_quantize(model, out, args.device, "soarpack" if args.path == "soarpack" else "gptqmodel-defaults")
    result.update(path=args.path, layers=args.layers, build_model_s=build_s,
                  peak_gpu_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None, peak_host_gib=hwm_gib(),
                  per_layer_gptq_s=result["phases_s"]["gptq"] / args.layers,
                  extrapolated_32_layer_gptq_s=result["phases_s"]["gptq"] / args.layers * 32)
    print(json.dumps(result, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
