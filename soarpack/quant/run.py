"""`soarpack quantize`: GPTQ of a MiniCPM-SALA checkpoint, read top to bottom in `quantize()`.

recipe → plan (check) → calibration and held-out rows (disjoint) → load → sanity (the original model's next-token
loss on the held-out rows must be finite and under a bound, so a wrong implementation or a corrupt checkpoint stops
here, not after twenty minutes) → gptq (soarpack.quant.engine, the one seam to GPTQModel) → save (temp dir) →
quality (KL of the written checkpoint against the original on the held-out rows; the math is soarpack.quant.quality)
→ verify → rename.

Each phase is a step of soarpack.steps' Runner, as `check`'s are (STEPS; `steps_for` leaves out what the options
turn off), run as a pipeline: the first phase that fails ends the run with its error. Progress goes to an
`on_event` callback (the CLI renders it) and, when asked, to a plain log file (soarpack.quant.logfile).
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
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import torch

from soarpack.errors import CheckpointError, ConfigError, SoarpackError
from soarpack.quant.logfile import run_output
from soarpack.quant.options import HELD_OUT_MAX_LEN, CalibrationSettings, QuantizeOptions, resolve_calibration
from soarpack.quant.quality import kl_stats, logprobs_of, next_token_loss
from soarpack.quant.warmup import start_warmups
from soarpack.sala.gla import current_backend, use_backend
from soarpack.steps import Event, EventCallback, Runner, Step, step

REPORT_FILE = "soarpack_quant_report.json"


@dataclass
class QuantizeResult:
    out_dir: str
    recipe: str
    device: str
    rows: int
    held_out_rows: int
    quantized_modules: int
    skipped_modules: int
    sanity_loss: float
    calibration: Dict[str, Any] = field(default_factory=dict)  # the settings used and which layer set each
    timings: Dict[str, float] = field(default_factory=dict)  # our phases, seconds
    gptq_timings: Dict[str, float] = field(default_factory=dict)  # GPTQModel's regions, seconds
    gptq_counts: Dict[str, int] = field(default_factory=dict)  # how often each region ran (hessian_inverse: Hessians)
    quality: Dict[str, Any] = field(default_factory=dict)
    gla: Dict[str, Any] = field(default_factory=dict)  # the GLA backend the run used and fla's agreement with torch
    modules: Dict[str, str] = field(default_factory=dict)  # every decoder linear: "4-bit g128" or "16-bit (kept)"
    settings: Dict[str, Any] = field(default_factory=dict)  # every option of the run, as given
    versions: Dict[str, str] = field(default_factory=dict)  # soarpack, python and the libraries that did the work
    notes: List[str] = field(default_factory=list)  # fallbacks taken (a JIT build, the GLA backend), rows short
    # Warning lines the libraries wrote to the log while the run lasted (counted when it ends: not in the report
    # file, which is written before); None when their output was not captured (library_output="terminal").
    library_warnings: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


# Progress is soarpack.steps' one event type: `start`/`end` bracket a phase, `info` is a line, `problem` a fallback
# taken, `progress` a GPTQ layer starting (done = layers before it, total = layers).


@dataclass
class Run:
    """What the check phase established: everything later phases need, validated."""

    config: Any
    recipe: Any
    calibration: CalibrationSettings
    sources: Dict[str, str]
    device: str


@dataclass
class CalibrationData:
    rows: List[List[int]]
    held_out: List[List[int]]
    origin: Dict[str, Any] = field(default_factory=dict)  # rows asked and used, and the files they came from


@dataclass
class Sanity:
    loss: float
    ref_logprobs: Optional[List[torch.Tensor]]
    gla: Any  # soarpack.quant.glacheck.GlaVerdict: the backend the rest of the run uses


class Lines:
    """What the phases say: `info` a line, `note` a fallback taken (shown even when quiet, and kept in the report),
    `layer` a GPTQ layer started, with its estimate of the time left."""

    def __init__(self, on_event: EventCallback):
        self.emit = on_event
        self.notes: List[str] = []
        self._layers_t0 = time.perf_counter()

    def info(self, phase: str, message: str) -> None:
        self.emit(Event("info", phase, message))

    def note(self, phase: str, message: str) -> None:
        self.notes.append(message)
        self.emit(Event("problem", phase, message))

    def layers_start(self) -> None:
        self._layers_t0 = time.perf_counter()

    def layer(self, i: int, n: int) -> None:
        spent = time.perf_counter() - self._layers_t0
        eta = f", eta {spent / i * (n - i):.0f}s" if i else ""
        # counted from 1, as the bar counts: `layer 3/8 started` is the third (done = the 2 before it)
        self.emit(Event("progress", "gptq", f"gptq layer {i + 1}/{n} started after {spent:.1f}s{eta}", spent, i, n))


@dataclass
class Quantization:
    """What the phases share: the inputs, and what earlier phases established."""

    model_dir: Path
    out_dir: Path
    opts: QuantizeOptions
    inputs: List[Path]
    lines: Lines
    stack: contextlib.ExitStack  # what lasts to the end of the run: the warm-ups' last lines, the GLA backend
    placing: contextlib.ExitStack  # the output's temp folder (soarpack.placement.write.atomic_dir): placed when it closes
    run: Optional[Run] = None
    warmups: Any = None
    data: Optional[CalibrationData] = None
    sala: Any = None  # the original model, until GPTQ is done with it
    sanity: Optional[Sanity] = None
    packed: Optional[Dict[str, Dict[str, torch.Tensor]]] = None  # GPTQ's tensors, until they are saved
    quantized_modules: int = 0
    quality: Dict[str, Any] = field(default_factory=dict)
    gptq_timings: Dict[str, float] = field(default_factory=dict)
    gptq_counts: Dict[str, int] = field(default_factory=dict)
    tmp: Optional[Path] = None  # where the checkpoint is written before it is placed


def quantize(model_dir: str | os.PathLike, out_dir: str | os.PathLike, opts: Optional[QuantizeOptions] = None,
             on_event: Optional[EventCallback] = None) -> QuantizeResult:
    """Quantize `model_dir` into `out_dir` (written atomically). See the module docstring for the phases."""
    from soarpack.placement.checks import ensure_writable_output
    from soarpack.placement.write import atomic_write_json

    opts = opts or QuantizeOptions()
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    check_out_is_not_here(out_dir)
    inputs = [model_dir, *(opts.calib or []), *(opts.held_out or [])]
    if opts.log_file:
        ensure_writable_output(opts.log_file, what="--log", inputs=inputs, replaced=[out_dir])
    with run_output(opts.log_file, on_event, capture=opts.library_output == "log") as output:
        lines = Lines(output.event)
        with contextlib.ExitStack() as stack:
            stack.enter_context(cuda_allocator_settings(lines))
            q = Quantization(model_dir, out_dir, opts, inputs, lines, stack, contextlib.ExitStack())
            with q.placing:
                report = Runner(steps_for(opts), output.event, stop_at_failure=True).run(q)
                result = quantize_result(q, {s.name: s.seconds for s in report.steps})
                atomic_write_json(q.tmp / REPORT_FILE,
                                  {k: v for k, v in result.to_dict().items() if k != "library_warnings"})
            lines.info("done", f"wrote {out_dir}: {result.quantized_modules} quantized, {result.skipped_modules} kept "
                       "16-bit; " + ", ".join(f"{k} {v:.1f}s" for k, v in result.timings.items()))
    result.library_warnings = output.library_warnings
    return result


def quantize_result(q: Quantization, timings: Dict[str, float]) -> QuantizeResult:
    run, data = q.run, q.data
    n_planned = len(run.recipe.plan(run.config))
    return QuantizeResult(
        out_dir=q.out_dir.name, recipe=run.recipe.name, device=run.device, rows=len(data.rows),
        held_out_rows=len(data.held_out), quantized_modules=q.quantized_modules,
        skipped_modules=n_planned - q.quantized_modules, sanity_loss=round(q.sanity.loss, 5),
        calibration={**run.calibration.model_dump(), "set_by": run.sources, **data.origin},
        timings=timings, gptq_timings=q.gptq_timings, gptq_counts=q.gptq_counts, quality=q.quality,
        gla=q.sanity.gla.to_dict(), modules=module_bits(run), settings=report_settings(q.opts),
        versions=library_versions(), notes=list(q.lines.notes))


# -- phases ------------------------------------------------------------------------------------------------------


def phase(name: str, needs: Sequence[str] = ()) -> Callable[[Callable[[Quantization], None]], Step]:
    """A quantize phase: a step that ends by handing the CUDA caching allocator's unused reserve back, so one
    phase's peak does not stay resident through the next."""
    def declare(fn: Callable[[Quantization], None]) -> Step:
        def run(q: Quantization) -> None:
            try:
                fn(q)
            finally:
                if torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
        return step(name, needs=needs)(run)
    return declare


@phase("check")
def check_phase(q: Quantization) -> None:
    q.run = check_inputs(q.model_dir, q.out_dir, q.inputs, q.opts, q.lines)
    q.warmups = start_warmups(q.run.device, q.run.config, current_backend())
    q.stack.callback(lambda: [q.lines.info("warmup", line) for line in q.warmups.wait_all()])


@phase("calibration", needs=["check"])
def calibration_phase(q: Quantization) -> None:
    q.data = prepare_calibration(q.model_dir, q.run, q.opts, q.lines)


@phase("load", needs=["check"])
def load_phase(q: Quantization) -> None:
    from soarpack.sala.checkpoint import load_model

    # On the CPU, as in GPTQModel's own loader: its looper moves one layer at a time to the GPU.
    q.sala = load_model(q.model_dir, dtype=torch.bfloat16, device="cpu", config=q.run.config)


@phase("sanity", needs=["calibration", "load"])
def sanity_phase(q: Quantization) -> None:
    if line := q.warmups.wait("fla"):
        q.lines.info("sanity", line)
    q.sanity = sanity_check(q.sala, q.data.held_out, q.run.device, q.opts, q.lines)
    q.stack.enter_context(use_backend(q.sanity.gla.backend))  # the backend the rest of the run uses


@phase("gptq", needs=["sanity"])
def gptq_phase(q: Quantization) -> None:
    from soarpack.quant import engine

    q.lines.layers_start()
    with engine.eager_block_update_while(
            q.warmups.threads.get("gptq-block-update") if q.opts.engine == "soarpack" else None):
        gptq = engine.run_gptq(q.sala, q.model_dir, q.data.rows, q.run.recipe, engine_options(q.run, q.opts),
                               q.lines.layer)
    q.sala = None
    if line := q.warmups.wait("gptq-block-update"):
        q.lines.note("gptq", line)
    q.packed = checked_quantized(gptq.packed, q.run)
    q.quantized_modules = len(q.packed)
    q.quality["gptq"] = gptq.module_losses
    q.gptq_timings, q.gptq_counts = gptq.region_seconds, gptq.region_counts


@phase("save", needs=["gptq"])
def save_phase(q: Quantization) -> None:
    from soarpack.placement.write import atomic_dir

    q.tmp = q.placing.enter_context(atomic_dir(q.out_dir, force=q.opts.force, inputs=q.inputs,
                                               log=lambda m: q.lines.note("save", m)))
    save_checkpoint(q.packed, q.model_dir, q.tmp, q.run, q.opts)
    q.packed = None


@phase("quality", needs=["save"])
def quality_phase(q: Quantization) -> None:
    q.quality["kl"] = measure_quality(q.tmp, q.data.held_out, q.sanity.ref_logprobs, q.run.device, q.lines)


@phase("verify", needs=["save"])
def verify_phase(q: Quantization) -> None:
    q.quality["dequant_error"] = verify_written(q.tmp, q.model_dir, q.out_dir.name, q.run.device, q.lines)


STEPS = (check_phase, calibration_phase, load_phase, sanity_phase, gptq_phase, save_phase, quality_phase,
         verify_phase)


def steps_for(opts: QuantizeOptions) -> List[Step]:
    """The phases this run has: --no-report leaves out quality, and verify can be turned off (tests)."""
    off = {"quality": not opts.quality, "verify": not opts.verify}
    return [s for s in STEPS if not off.get(s.name)]


def check_out_is_not_here(out_dir: Path) -> None:
    """OUT is written beside itself and renamed into place: the folder this process runs in (`.`), or one that
    holds it, cannot be renamed away from under it, and replacing it would leave the shell in a deleted folder.
    Refused before any work (`quantize M . --force` used to run to the end, then fail to place the checkpoint)."""
    try:
        here, out = Path.cwd().resolve(), out_dir.resolve()
    except OSError:
        return
    if out == here or out in here.parents:
        what = "is the current folder" if out == here else "holds the current folder"
        raise ConfigError(f"OUT {out_dir} {what} ({out}): the checkpoint is written as a new folder and renamed into "
                          "place, which cannot replace the folder this command runs in",
                          "pass a new folder for OUT (e.g. ./sala-w4), or run from another folder")


# -- phases ------------------------------------------------------------------------------------------------------


def check_inputs(model_dir: Path, out_dir: Path, inputs: List[Path], opts: QuantizeOptions, log: Lines) -> Run:
    """Every refusal that needs no calibration and no weights: config, recipe against it, settings, output, engine."""
    from soarpack.placement.write import prepare_output_dir
    from soarpack.quant import engine
    from soarpack.quant.calib import check_max_len
    from soarpack.recipe.model import load_recipe
    from soarpack.sala.config import load_config
    from soarpack.sala.tokenizer import check_vocab_fits, load_tokenizer

    # Replaceable, writable, overlapping no input: found now, not after gptq. Stale temp folders of killed runs go.
    prepare_output_dir(out_dir, opts.force, inputs=inputs, log=lambda m: log.note("check", m))
    config = load_config(model_dir)
    check_vocab_fits(load_tokenizer(model_dir), config.vocab_size, model_dir)
    recipe = load_recipe(opts.recipe)
    if not recipe.quantizes:
        from soarpack.errors import ConfigError

        raise ConfigError(f"recipe {recipe.name} quantizes nothing (method = \"none\"): there is nothing to quantize",
                          "serve the original checkpoint as it is (a bundle's prepare_model.sh copies it); "
                          "pick a GPTQ recipe to quantize")
    recipe.validate_for(config)
    calibration, sources = resolve_calibration(opts.calibration, recipe.calibration)
    check_max_len(calibration.max_len, config.dense_len)
    device = resolve_device(opts.device)
    engine.ensure_supported()
    log.info("check", f"recipe {recipe.name}: {recipe.bits}-bit g{recipe.group_size} sym={recipe.sym} "
             f"desc_act={recipe.desc_act} damp={recipe.damp}; {len(recipe.render_dynamic(config))} dynamic rule(s); "
             f"device {device}; engine {opts.engine}; calibration "
             + ", ".join(f"{'rows asked' if k == 'rows' else k} {v} ({sources[k]})"
                         for k, v in calibration.model_dump().items()))
    return Run(config, recipe, calibration, sources, device)


def prepare_calibration(model_dir: Path, run: Run, opts: QuantizeOptions, log: Lines) -> CalibrationData:
    from soarpack.quant.calib import build_calibration, build_held_out
    from soarpack.quant.calibinfo import rows_line, shortfall, where_from
    from soarpack.sala.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    c = run.calibration
    rows = build_calibration(opts.calib, tokenizer, rows=c.rows, max_len=c.max_len, seed=c.seed,
                             dense_len=run.config.dense_len)
    held = build_held_out(opts.held_out, tokenizer, rows=opts.held_out_rows, max_len=c.max_len, seed=c.seed,
                          calibration=rows, dense_len=run.config.dense_len)
    data = CalibrationData([r.ids for r in rows], [r.ids[-HELD_OUT_MAX_LEN:] for r in held],
                           calibration_origin(opts.calib, len(rows), c.rows, run.sources["rows"]))
    where = where_from(data.origin["sources"], data.origin["builtin"])
    log.info("calibration", f"{rows_line(len(data.rows), c.rows, run.sources['rows'], where)}; "
             f"{sum(map(len, data.rows))} tokens; "
             f"{len(data.held_out)} held-out rows ({'files' if opts.held_out else 'built-in'}), disjoint")
    short = shortfall(len(data.rows), c.rows, run.sources["rows"], where)
    if short:
        log.note("calibration", short)
    return data


def calibration_origin(paths: Optional[Sequence[Path]], used: int, asked: int, asked_by: str) -> Dict[str, Any]:
    """For the report: rows asked (and by whom), rows used, and the files they came from (or the built-in)."""
    from soarpack.quant.calibinfo import sources_of

    return {"rows_asked": asked, "asked_by": asked_by, "rows_used": used, "builtin": not paths,
            "sources": sources_of(paths or [])}


def sanity_check(sala: torch.nn.Module, held_out: List[List[int]], device: str, opts: QuantizeOptions,
                 log: Lines) -> Sanity:
    """One layer-streamed forward of the original model over the held-out rows serves the sanity loss, the KL
    reference and, on a GPU with fla, the check that fla's GLA agrees with soarpack's (see glacheck)."""
    from soarpack.quant.glacheck import FlaComparison, judge, should_compare
    from soarpack.sala.gla import observe_torch_path
    from soarpack.sala.streaming import model_source, streamed_logits

    comparison = FlaComparison() if should_compare(device) else None
    with use_backend("torch"), (observe_torch_path(comparison) if comparison else contextlib.nullcontext()):
        logits = streamed_logits(sala.config, model_source(sala), held_out, device)
    verdict = judge(comparison)
    if verdict.problem:
        log.note("sanity", verdict.problem)
    elif verdict.rel_diff is not None:
        log.info("sanity", f"fla's GLA agrees with soarpack's torch GLA: relative difference {verdict.rel_diff:.2e} "
                           f"over {verdict.calls} calls (bound {verdict.bound:.0e})")
    ref_logprobs = logprobs_of(logits)
    del logits
    loss = next_token_loss(ref_logprobs, held_out)
    log.info("sanity", f"original next-token loss on {len(held_out)} held-out rows: {loss:.3f} nats")
    if not math.isfinite(loss):
        raise CheckpointError("the original model's loss is not finite (NaN/Inf)",
                              "the checkpoint is corrupt or not a MiniCPM-SALA release")
    if opts.sanity_max_loss is not None and loss > opts.sanity_max_loss:
        raise CheckpointError(
            f"the original model's next-token loss {loss:.2f} exceeds the sanity bound {opts.sanity_max_loss}",
            "the checkpoint or soarpack.sala is wrong; raise --max-sanity-loss only if you know the model is fine",
        )
    return Sanity(loss, ref_logprobs if opts.quality else None, verdict)


def engine_options(run: Run, opts: QuantizeOptions) -> Any:
    from soarpack.quant.engine import EngineOptions

    return EngineOptions(device=run.device, batch_size=run.calibration.batch, mode=opts.engine,
                         shared_input_hessians=opts.shared_input_hessians, offload_to_disk=opts.offload_to_disk)


def checked_quantized(quantized: Dict[str, Dict[str, torch.Tensor]], run: Run) -> Dict[str, Dict[str, torch.Tensor]]:
    """The packed tensors GPTQModel wrote, refused unless they are exactly the plan's module set."""
    expected = {n for n, mq in run.recipe.plan(run.config).items() if mq is not None}
    if set(quantized) != expected:
        missing, extra = sorted(expected - set(quantized)), sorted(set(quantized) - expected)
        raise SoarpackError(f"GPTQModel quantized a different module set than the recipe names "
                            f"(missing {missing[:3]}, unexpected {extra[:3]})", "report this as a bug")
    return quantized


def save_checkpoint(quantized: Dict[str, Dict[str, torch.Tensor]], model_dir: Path, tmp: Path, run: Run,
                    opts: QuantizeOptions) -> None:
    from soarpack.quant.engine import quantizer
    from soarpack.quant.finalize import collect_tensors, copy_side_files, write_config
    from soarpack.recipe.checkpoint import quantization_config
    from soarpack.sala.checkpoint import iter_tensors, save_state_dict

    fp16 = opts.float_dtype == "float16"
    tensors = collect_tensors(quantized, iter_tensors(model_dir), float_dtype=torch.float16 if fp16 else torch.bfloat16)
    save_state_dict(tensors, tmp)
    del tensors
    write_config(model_dir, tmp, quantization_config(run.recipe, run.config, quantizer()), auto_map=opts.auto_map,
                 torch_dtype="float16" if fp16 else None)
    copy_side_files(model_dir, tmp)


def measure_quality(ckpt: Path, held_out: List[List[int]], ref_logprobs: List[torch.Tensor], device: str,
                    log: Lines) -> Dict[str, float]:
    """KL on what was written: the checkpoint's tensors read back from disk and dequantized one layer at a time
    (our own dequantization, not GPTQModel's modules), through the same layer-streamed forward as the sanity."""
    from soarpack.quant.dequantize import dequantized_source
    from soarpack.sala.config import load_config
    from soarpack.sala.streaming import streamed_logits

    with use_backend("torch"):  # as the reference was computed
        logits = streamed_logits(load_config(ckpt), dequantized_source(ckpt, dtype=torch.bfloat16, device=device),
                                 held_out, device)
    kl = kl_stats(ref_logprobs, logprobs_of(logits))
    log.info("quality", "KL(original ‖ quantized) mean {kl_mean:.4g} max {kl_max:.4g}, top-1 agreement "
             "{top1_agreement:.3f}".format(**kl))
    return kl


def verify_written(ckpt: Path, model_dir: Path, output_name: str, device: str, log: Lines) -> Dict[str, float]:
    from soarpack.quant.verify import verify_report

    report = verify_report(ckpt, original=model_dir, output_name=output_name, device=device)
    for p in report.problems:
        log.emit(Event("problem", "verify", str(p)))
    if report.problems:
        more = f" and {len(report.problems) - 1} more" if len(report.problems) > 1 else ""
        raise CheckpointError(f"the written checkpoint fails verification: {report.problems[0]}{more}",
                              "nothing was written; report this as a bug")
    return report.module_errors


# -- measurement helpers -----------------------------------------------------------------------------------------


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ConfigError(f"--device {device!r} is not auto, cpu or cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no CUDA device", "use --device cpu or auto")
    return device


def module_bits(run: Run) -> Dict[str, str]:
    """What the run did to each decoder linear, for the report."""
    return {name: f"{mq.bits}-bit g{mq.group_size}" if mq is not None else "16-bit (kept)"
            for name, mq in run.recipe.plan(run.config).items()}


def report_settings(opts: QuantizeOptions) -> Dict[str, Any]:
    """Every option, with files by name only: the report travels with the checkpoint, machine paths do not."""
    def name_only(value: Any) -> Any:
        if isinstance(value, Path):
            return value.name
        if isinstance(value, list):
            return [name_only(v) for v in value]
        return value

    return {k: name_only(getattr(opts, k)) if k in ("calib", "held_out", "log_file") else v
            for k, v in opts.model_dump(mode="json").items()}


def library_versions() -> Dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    from soarpack.version import __version__

    found = {"soarpack": __version__, "python": sys.version.split()[0]}
    for name in ("torch", "gptqmodel", "transformers", "safetensors", "triton", "fla-core", "flash-linear-attention"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


@contextmanager
def cuda_allocator_settings(log: Lines) -> Iterator[None]:
    """Expandable segments for the CUDA caching allocator (less reserve lost to fragmentation between phases that
    allocate differently), set only for this call: the variable is read when CUDA initialises, and restored after.
    A setting the user made is left alone (GPTQModel's import also sets it when unset: ours comes first)."""
    names = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
    if any(n in os.environ for n in names) or not torch.cuda.is_available():
        yield
        return
    if torch.cuda.is_initialized():
        log.info("check", "CUDA was initialised before quantize: the allocator keeps its settings")
    os.environ[names[0]] = "expandable_segments:True"
    try:
        yield
    finally:
        os.environ.pop(names[0], None)
