"""`soarpack quantize`: GPTQ W4A16 of a MiniCPM-SALA checkpoint with GPTQModel as the engine.

Phases (each timed and logged): check inputs → calibration → load → sanity (the original model's next-token loss
on held-out rows must be finite and under a bound, so a wrong implementation or corrupt checkpoint stops here, not
after twenty minutes) → gptq (GPTQModel: forward, Hessian, solve, pack, per layer) → quality (KL of the quantized
model's next-token distributions against the original on the held-out rows) → save (temp dir) → verify → rename.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from soarpack.errors import CheckpointError, ConfigError, SoarpackError
from soarpack.quant.calib import DEFAULT_MAX_LEN, DEFAULT_ROWS, build_calibration, load_tokenizer

DEFAULT_BATCH = 4  # rows per forward; sorted by length so padding is small, and GPTQModel masks it out of H
DEFAULT_SANITY_MAX_LOSS = 8.0  # nats; a random or broken 73k-vocab model sits near ln(vocab) ≈ 11.2; not yet measured on the real model
EVAL_ROWS = 4
EVAL_MAX_LEN = 512


@dataclass
class QuantizeResult:
    out_dir: str
    recipe: str
    device: str
    rows: int
    quantized_modules: int
    skipped_modules: int
    sanity_loss: float
    timings: Dict[str, float] = field(default_factory=dict)  # our phases, seconds
    gptq_timings: Dict[str, float] = field(default_factory=dict)  # GPTQModel's regions, seconds
    quality: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class RunLog:
    """Phase lines to a rich console (stderr) and, when asked, a plain log file."""

    def __init__(self, log_file: Optional[str | os.PathLike], quiet: bool = False):
        from rich.console import Console

        self.console = Console(stderr=True, quiet=quiet)
        self.fh = open(log_file, "a", encoding="utf-8") if log_file else None
        self.timings: Dict[str, float] = {}

    def line(self, msg: str, console: bool = True) -> None:
        """`msg` may hold rich markup; the log file gets the plain text."""
        if console:
            self.console.print(msg, highlight=False)
        if self.fh:
            from rich.text import Text

            self.fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {Text.from_markup(msg).plain}\n")
            self.fh.flush()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.line(f"[bold]{name}[/] ...")
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.timings[name] = self.timings.get(name, 0.0) + dt
            self.line(f"[bold]{name}[/] {dt:.1f}s")

    def close(self) -> None:
        if self.fh:
            self.fh.close()


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ConfigError(f"--device {device!r} is not auto, cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no CUDA device", "use --device cpu or auto")
    return device


def next_token_loss(logprobs: Sequence[Any], rows: Sequence[Sequence[int]]) -> float:
    """Mean next-token cross entropy (nats) from the per-row log-probabilities of `next_token_logprobs`."""
    import torch

    total, count = 0.0, 0
    for lp, ids in zip(logprobs, rows):
        targets = torch.tensor(list(ids)[1:], dtype=torch.long)
        total -= float(lp[:-1].gather(-1, targets.unsqueeze(-1)).sum())
        count += len(targets)
    return total / max(count, 1)


def next_token_logprobs(model, rows: Sequence[Sequence[int]], device: str) -> List[Any]:
    import torch

    out = []
    with torch.no_grad():
        for ids in rows:
            logits = model(torch.tensor([list(ids)], device=device)).float()
            out.append(torch.log_softmax(logits[0], dim=-1).cpu())
    return out


def kl_stats(ref_logprobs: Sequence[Any], new_logprobs: Sequence[Any]) -> Dict[str, float]:
    """KL(ref ‖ new) per position: mean and max, plus top-1 agreement."""
    import torch

    kls, agree, n = [], 0, 0
    for p, q in zip(ref_logprobs, new_logprobs):
        kl = (p.exp() * (p - q)).sum(-1)
        kls.append(kl)
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        n += p.shape[0]
    allk = torch.cat(kls)
    return {"kl_mean": float(allk.mean()), "kl_max": float(allk.max()), "top1_agreement": agree / max(n, 1),
            "positions": n}


def _gptqmodel_quant_config(recipe, config, device: str, offload_to_disk: bool):
    from gptqmodel import QuantizeConfig
    from gptqmodel.models._const import normalize_device

    dynamic = recipe.gptqmodel_dynamic(config) or None
    qcfg = QuantizeConfig(bits=recipe.bits, group_size=recipe.group_size, sym=recipe.sym, desc_act=recipe.desc_act,
                          damp_percent=recipe.damp, true_sequential=True, dynamic=dynamic,
                          offload_to_disk=offload_to_disk, device=device,
                          # packing dominates on GPU (SALA.md §6): pack there when we have one
                          pack_impl="gpu" if device.startswith("cuda") else "cpu",
                          fallback=None)  # never let a module fall back to round-to-nearest
    qcfg.device = normalize_device(device)
    return qcfg


def _gptq_region_totals(gm) -> Dict[str, float]:
    timer = getattr(gm, "quant_region_timer", None)
    stats = getattr(timer, "_stats", None) or {}
    return {k: round(float(v.get("total", 0.0)), 3) for k, v in stats.items() if v.get("count")}


class LayerProgress:
    """Rich progress per decoder layer with ETA: a layer counts as started at its first forward."""

    def __init__(self, layers, log: RunLog):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.log = log
        self.n = len(layers)
        self.progress = Progress(TextColumn("gptq layer {task.completed}/{task.total}"), BarColumn(),
                                 TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                                 console=log.console, transient=True)
        self.task = self.progress.add_task("gptq", total=self.n)
        self.started = -1
        self.t0 = time.perf_counter()
        self.handles = [layer.register_forward_pre_hook(self._hook(i)) for i, layer in enumerate(layers)]

    def _hook(self, i):
        def hook(module, args):
            if i > self.started:
                self.started = i
                self.progress.update(self.task, completed=i)
                spent = time.perf_counter() - self.t0
                eta = f", eta {spent / i * (self.n - i):.0f}s" if i else ""
                self.log.line(f"gptq layer {i}/{self.n} started after {spent:.1f}s{eta}", console=False)
        return hook

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.update(self.task, completed=self.n)
        self.progress.stop()
        for h in self.handles:
            h.remove()


def quantize(
    model_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    recipe="w4-mlp",
    calib: Optional[Sequence[str | os.PathLike]] = None,
    num_rows: int = DEFAULT_ROWS,
    max_len: int = DEFAULT_MAX_LEN,
    seed: int = 0,
    device: str = "auto",
    force: bool = False,
    log_file: Optional[str | os.PathLike] = None,
    sanity_max_loss: Optional[float] = DEFAULT_SANITY_MAX_LOSS,
    eval_rows: int = EVAL_ROWS,
    float_dtype: str = "bfloat16",
    auto_map: str = "keep",
    offload_to_disk: bool = False,
    batch_size: int = DEFAULT_BATCH,
    quality: bool = True,
    verify: bool = True,
    quiet: bool = False,
) -> QuantizeResult:
    """Quantize `model_dir` into `out_dir` (written atomically). See the module docstring for the phases."""
    from rich.markup import escape

    from soarpack.fsutil import atomic_dir, atomic_write_json, ensure_writable_output, prepare_output_dir
    from soarpack.quant.finalize import AUTO_MAP_MODES
    from soarpack.quant.recipe import load_recipe
    from soarpack.sala.config import load_config

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    inputs = [model_dir, *(calib or [])]
    if log_file:
        ensure_writable_output(log_file, what="--log", inputs=inputs)
    log = RunLog(log_file, quiet=quiet)
    log_line = lambda msg: log.line(escape(msg))  # noqa: E731 - paths may hold [brackets]
    try:
        with log.phase("check"):
            config = load_config(model_dir)
            rec = load_recipe(recipe)
            rec.validate_for(config)
            prepare_output_dir(out_dir, force, inputs=inputs, log=log_line)  # found now, not after gptq
            if float_dtype not in ("bfloat16", "float16"):
                raise ConfigError(f"float dtype {float_dtype!r} is not bfloat16 or float16")
            if auto_map not in AUTO_MAP_MODES:
                raise ConfigError(f"auto_map mode {auto_map!r} is not one of {', '.join(AUTO_MAP_MODES)}")
            dev = resolve_device(device)
            if (os.cpu_count() or 1) <= 3:  # GPTQModel's default of one CPU worker crashes quantize() there
                os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
            log.line(f"recipe {rec.name}: {rec.bits}-bit g{rec.group_size} sym={rec.sym} desc_act={rec.desc_act} "
                     f"damp={rec.damp}; {len(rec.render_dynamic(config))} dynamic rule(s); device {dev}")

        with log.phase("calibration"):
            tokenizer = load_tokenizer(model_dir)
            rows = build_calibration(calib, tokenizer, rows=num_rows + eval_rows, max_len=max_len, seed=seed,
                                     dense_len=config.dense_len)
            held_out = [r.ids[-EVAL_MAX_LEN:] for r in rows[num_rows:]] if len(rows) > num_rows else []
            calib_rows = [r.ids for r in rows[:num_rows]]
            if not held_out:  # too few examples: evaluate on a few calibration rows rather than nothing
                held_out = [ids[-EVAL_MAX_LEN:] for ids in calib_rows[:eval_rows]]
            log.line(f"{len(calib_rows)} calibration rows, {sum(map(len, calib_rows))} tokens; {len(held_out)} held out")

        import torch

        from soarpack.sala.checkpoint import iter_tensors, load_model

        with log.phase("load"):
            # The model lives on the CPU, as in GPTQModel's own loader: its looper moves one layer at a time
            # to the GPU. Only the sanity forward borrows the GPU for the whole model.
            sala = load_model(model_dir, dtype=torch.bfloat16, device="cpu", config=config)

        with log.phase("sanity"):
            sala.to(dev)
            # one forward over the held-out rows serves the sanity loss and the quality reference
            ref_logprobs = next_token_logprobs(sala, held_out, dev)
            sanity_loss = next_token_loss(ref_logprobs, held_out)
            log.line(f"original next-token loss on {len(held_out)} held-out rows: {sanity_loss:.3f} nats")
            if not math.isfinite(sanity_loss):
                raise CheckpointError("the original model's loss is not finite (NaN/Inf)",
                                      "the checkpoint is corrupt or not a MiniCPM-SALA release")
            if sanity_max_loss is not None and sanity_loss > sanity_max_loss:
                raise CheckpointError(
                    f"the original model's next-token loss {sanity_loss:.2f} exceeds the sanity bound {sanity_max_loss}",
                    "the checkpoint or soarpack.sala is wrong; raise --max-sanity-loss only if you know the model is fine",
                )
            if not quality:
                ref_logprobs = None
            sala.to("cpu")
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()

        # GPTQModel logs to stdout; keep stdout for our result (`--json`).
        with log.phase("gptq"), contextlib.redirect_stdout(sys.stderr):
            from soarpack.sala.hf import gptq_definition, wrap_for_hf  # imports GPTQModel (a banner, seconds)

            _redirect_gptqmodel_logs(Path(log_file).parent if log_file else None)

            hf = wrap_for_hf(sala)
            hf.seqlen = config.dense_len
            qcfg = _gptqmodel_quant_config(rec, config, dev, offload_to_disk)
            gm = gptq_definition()(hf, quantized=False, quantize_config=qcfg, tokenizer=None,
                                   model_local_path=str(model_dir))
            examples = [{"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
                        for ids in calib_rows]
            with LayerProgress(list(sala.model.layers), log):
                gptq_log = gm.quantize(examples, batch_size=batch_size, calibration_sort="desc")
            gptq_timings = _gptq_region_totals(gm)

        from soarpack.quant.finalize import (collect_tensors, copy_side_files, extract_quantized,
                                             quantization_config, write_config)

        quantized = extract_quantized(sala)
        n_quantized = len(quantized)
        plan = rec.plan(config)
        expected_q = {n for n, mq in plan.items() if mq is not None}
        if set(quantized) != expected_q:
            missing, extra = sorted(expected_q - set(quantized)), sorted(set(quantized) - expected_q)
            raise SoarpackError(f"GPTQModel quantized a different module set than the recipe names "
                                f"(missing {missing[:3]}, unexpected {extra[:3]})", "report this as a bug")

        quality_report: Dict[str, Any] = {"gptq": _module_losses(gptq_log)}
        del gm, hf, examples

        with atomic_dir(out_dir, force=force, inputs=inputs, log=log_line) as tmp:
            with log.phase("save"):
                fdt = torch.bfloat16 if float_dtype == "bfloat16" else torch.float16
                tensors = collect_tensors(quantized, iter_tensors(model_dir), float_dtype=fdt)
                from soarpack.sala.checkpoint import save_state_dict

                save_state_dict(tensors, tmp)
                del tensors
                write_config(model_dir, tmp, quantization_config(rec, config), auto_map=auto_map,
                             torch_dtype=None if float_dtype == "bfloat16" else "float16")
                copy_side_files(model_dir, tmp)
            if quality:
                # Measured on what was written, read back with our own dequantization, not on GPTQModel's modules.
                with log.phase("quality"):
                    from soarpack.quant.dequantize import load_dequantized

                    del sala, quantized
                    if dev.startswith("cuda"):
                        torch.cuda.empty_cache()
                    deq = load_dequantized(tmp, dtype=torch.bfloat16, device=dev)
                    quality_report["kl"] = kl_stats(ref_logprobs, next_token_logprobs(deq, held_out, dev))
                    del deq, ref_logprobs
                    log.line("KL(original ‖ quantized) mean {kl_mean:.4g} max {kl_max:.4g}, top-1 agreement "
                             "{top1_agreement:.3f}".format(**quality_report["kl"]))
            if verify:
                with log.phase("verify"):
                    from soarpack.quant.verify import verify_report

                    report = verify_report(tmp, original=model_dir, output_name=out_dir.name, device=dev)
                    quality_report["dequant_error"] = report.module_errors
                    if report.problems:
                        for p in report.problems:
                            log.line(f"[red]problem[/] {p}")
                        raise CheckpointError(f"the written checkpoint fails verification: {report.problems[0]}"
                                              + (f" and {len(report.problems) - 1} more" if len(report.problems) > 1 else ""),
                                              "nothing was written; report this as a bug")
            result = QuantizeResult(
                out_dir=out_dir.name, recipe=rec.name, device=dev, rows=len(calib_rows),
                quantized_modules=n_quantized, skipped_modules=len(plan) - n_quantized,
                sanity_loss=round(sanity_loss, 5), timings={k: round(v, 3) for k, v in log.timings.items()},
                gptq_timings=gptq_timings, quality=quality_report,
            )
            atomic_write_json(tmp / "soarpack_quant_report.json", result.to_dict())
        log.line(f"[green]wrote[/] {out_dir}: {n_quantized} quantized, {len(plan) - n_quantized} kept 16-bit; "
                 + ", ".join(f"{k} {v:.1f}s" for k, v in log.timings.items()))
        return result
    finally:
        log.close()


def _redirect_gptqmodel_logs(folder: Optional[Path]) -> None:
    """GPTQModel writes per-module logs to ./logs of whatever the working directory is; send them beside our log
    file, or to a temp folder, so a run never litters the user's directory. (A module attribute of 7.6.0.)"""
    import tempfile

    from gptqmodel.looper import loop_processor

    if hasattr(loop_processor, "_PROJECT_LOG_DIR"):
        loop_processor._PROJECT_LOG_DIR = (folder or Path(tempfile.gettempdir())) / "gptqmodel-logs"


def _module_losses(gptq_log) -> List[Dict[str, Any]]:
    rows = []
    for entry in (gptq_log or {}).get("gptq", []) if isinstance(gptq_log, dict) else []:
        try:
            rows.append({"layer": int(entry["layer"]), "module": entry["module"], "loss": float(entry["loss"]),
                         "samples": int(entry.get("samples", 0))})
        except (KeyError, TypeError, ValueError):
            continue
    return rows
