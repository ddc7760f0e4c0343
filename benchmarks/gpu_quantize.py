"""Full-width quantization on a GPU through the production path, or through GPTQModel's defaults for comparison.

    python benchmarks/gpu_quantize.py --work /tmp/fq [--layers 8] [--path soarpack|gptqmodel-default] [--json F]
        [--cap-gib 16] [--build-only] [--hashes F]

Builds a synthetic MiniCPM-SALA with the release's shapes (hidden 4096, MLP 16384, 32/2 sparse heads, 32 Lightning
heads, vocab 73448; random bf16 weights, seeded, made on the GPU) with `--layers` layers in the release's 1:3
sparse:Lightning ratio (at 32, the release's own order), and the tiny model's tokenizer. Then:
- `--path soarpack`: `soarpack.quant.run.quantize` exactly as `soarpack quantize` runs it (recipe w4-full, 256
  built-in calibration rows up to 2048 tokens, damp 0.05, batch 4, shared-input Hessians, offload_to_disk=False,
  sanity bound off because the weights are random) and prints its phases;
- `--path gptqmodel-default`: the same `quantize` with the engine's "gptqmodel-defaults" mode: a plain SALA
  definition and `QuantizeConfig(bits=4, group_size=128, sym=True, desc_act=False)` with every other setting at
  GPTQModel's defaults but offload_to_disk, batch 1 (no KL report, no verify); our finalize writes the checkpoint.
Peak GPU memory: torch's max_memory_allocated, and the driver's view of this process (NVML through pynvml when
importable, else `nvidia-smi --query-compute-apps`), sampled every 0.2 s in a thread, overall and per phase.
`--cap-gib N` caps torch's allocator (set_per_process_memory_fraction) to prove a run fits a smaller card.
`--build-only` builds the synthetic model and stops (build and quantize as separate processes: the build's CUDA
allocations stay out of the quantize process). `--hashes F` writes the sha256 of every tensor of the written
checkpoint, to compare two runs bit for bit. Peak host memory is VmHWM.
"""

from __future__ import annotations

import argparse
import json
import os
import hashlib
import shutil
import subprocess
import sys
import threading
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
    if shape == "tiny" or layers != raw["num_hidden_layers"]:  # all 32: the release's own layer order
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


class DriverMemory:
    """This process's GPU memory as the driver reports it (what nvidia-smi shows), sampled in a thread."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.pid = interval, os.getpid()
        self.peak_mib, self.phase_peaks_mib, self.phase = 0.0, {}, "start"
        self.source = self._pick_source()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _pick_source(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

            def nvml() -> float:
                used = 0
                for h in handles:
                    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                        if p.pid == self.pid and p.usedGpuMemory:
                            used += p.usedGpuMemory
                return used / 2**20
            self.source_name = "nvml"
            return nvml
        except Exception:  # noqa: BLE001 — no pynvml or no driver: try nvidia-smi
            pass
        if shutil.which("nvidia-smi"):
            def smi() -> float:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5).stdout
                return sum(float(mem) for pid, mem in (line.split(",") for line in out.splitlines() if "," in line)
                           if int(pid) == self.pid)
            self.source_name = "nvidia-smi"
            return smi
        self.source_name = None
        return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                mib = self.source()
            except Exception:  # noqa: BLE001 — one failed sample is not worth a crash
                mib = 0.0
            self.peak_mib = max(self.peak_mib, mib)
            self.phase_peaks_mib[self.phase] = max(self.phase_peaks_mib.get(self.phase, 0.0), mib)
            self._stop.wait(self.interval)

    def __enter__(self) -> "DriverMemory":
        if self.source is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def run_quantize(model: Path, out: Path, device: str, engine: str, log_file: Path, driver: DriverMemory) -> dict:
    from soarpack.quant.options import quantize_options
    from soarpack.quant.run import quantize

    opts = quantize_options(recipe="w4-full", rows=256, max_len=2048, device=device, force=True, sanity_max_loss=None,
                            log_file=log_file, engine=engine,
                            quality=engine == "soarpack", verify=engine == "soarpack")
    torch_peaks: dict = {}

    def on_event(event) -> None:
        cuda = device.startswith("cuda") and torch.cuda.is_initialized()
        if event.kind == "phase-start":
            driver.phase = event.phase
            if cuda:
                torch.cuda.reset_peak_memory_stats()
        elif event.kind == "phase-end" and cuda:
            torch_peaks[event.phase] = round(torch.cuda.max_memory_allocated() / 2**30, 2)

    t0 = time.perf_counter()
    res = quantize(model, out, opts, on_event=on_event)
    return {"wall_s": time.perf_counter() - t0, "phases_s": res.timings, "gptq_regions_s": res.gptq_timings,
            "quantized_modules": res.quantized_modules, "rows": res.rows, "kl": res.quality.get("kl"),
            "sanity_loss": res.sanity_loss, "gla": res.gla, "notes": res.notes,
            "phase_peak_torch_gib": torch_peaks}


def tensor_hashes(ckpt: Path) -> dict:
    """sha256 of every tensor's bytes in a written checkpoint, by name."""
    from soarpack.sala.checkpoint import iter_tensors

    return {name: hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
            for name, t in iter_tensors(ckpt)}


def phases_table(result: dict) -> str:
    driver = result.get("phase_peak_driver_mib") or {}
    torch_peaks = result.get("phase_peak_torch_gib") or {}
    lines = ["| phase | seconds | peak torch GiB | peak driver MiB |", "|---|---:|---:|---:|"]
    for phase, secs in result["phases_s"].items():
        lines.append(f"| {phase} | {secs:.1f} | {torch_peaks.get(phase, '')} | "
                     f"{round(driver[phase]) if phase in driver else ''} |")
    lines.append(f"| **total** | {sum(result['phases_s'].values()):.1f} | {result.get('peak_gpu_gib') or ''} | "
                 f"{round(result.get('peak_driver_mib') or 0) or ''} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--path", choices=("soarpack", "gptqmodel-default"), default="soarpack")
    ap.add_argument("--json", type=Path, help="write the result here too")
    ap.add_argument("--log", type=Path, help="the run's log (default: WORK/quantize-PATH.log)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=("release", "tiny"), default="release")
    ap.add_argument("--cap-gib", type=float, help="cap torch's allocator at this many GiB")
    ap.add_argument("--build-only", action="store_true", help="build the synthetic model, then stop")
    ap.add_argument("--hashes", type=Path, help="write the sha256 of every written tensor here (JSON)")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model = build_model(args.work, args.layers, args.device, args.shape)
    build_s = time.perf_counter() - t0
    if args.build_only:
        print(json.dumps({"model": str(model), "build_model_s": round(build_s, 1)}))
        return
    if cuda and args.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_gib * 2**30 / total))
    out = args.work / f"out-{args.path}"
    log_file = args.log or args.work / f"quantize-{args.path}.log"
    with DriverMemory() as driver:
        result = run_quantize(model, out, args.device, "soarpack" if args.path == "soarpack" else "gptqmodel-defaults",
                              log_file, driver)
    result.update(path=args.path, layers=args.layers, build_model_s=build_s, cap_gib=args.cap_gib,
                  peak_gpu_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                  peak_driver_mib=driver.peak_mib or None, phase_peak_driver_mib=driver.phase_peaks_mib,
                  driver_memory_source=driver.source_name, peak_host_gib=round(hwm_gib(), 2),
                  per_layer_gptq_s=result["phases_s"]["gptq"] / args.layers, log=str(log_file))
    if args.hashes:
        args.hashes.write_text(json.dumps(tensor_hashes(out), indent=1, sort_keys=True))
    print(phases_table(result))
    print(json.dumps(result, indent=1, default=str))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
