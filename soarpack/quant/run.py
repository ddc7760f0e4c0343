"""`soarpack quantize`: GPTQ of a MiniCPM-SALA checkpoint, read top to bottom in `quantize()`.

recipe → plan (check) → calibration and held-out rows (disjoint) → load → sanity (the original model's next-token
loss on the held-out rows must be finite and under a bound, so a wrong implementation or a corrupt checkpoint stops
here, not after twenty minutes) → gptq (soarpack.quant.engine, the one seam to GPTQModel) → save (temp dir) →
quality (KL of the written checkpoint against the original on the held-out rows; the math is soarpack.quant.quality)
→ verify → rename.

Progress goes to an `on_event` callback (the CLI renders it) and, when asked, to a plain log file.
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
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence

import torch

from soarpack.errors import CheckpointError, ConfigError, SoarpackError
from soarpack.quant.options import HELD_OUT_MAX_LEN, CalibrationSettings, QuantizeOptions, resolve_calibration
from soarpack.quant.quality import kl_stats, logprobs_of, next_token_loss
from soarpack.quant.warmup import start_warmups
from soarpack.sala.gla import current_backend, use_backend
from soarpack.steps import Event, EventCallback

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


def quantize(model_dir: str | os.PathLike, out_dir: str | os.PathLike, opts: Optional[QuantizeOptions] = None,
             on_event: Optional[EventCallback] = None) -> QuantizeResult:
    """Quantize `model_dir` into `out_dir` (written atomically). See the module docstring for the phases."""
    from soarpack.placement.checks import ensure_writable_output
    from soarpack.placement.write import atomic_dir, atomic_write_json
    from soarpack.quant import engine
    from soarpack.sala.checkpoint import load_model

    opts = opts or QuantizeOptions()
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    check_out_is_not_here(out_dir)
    inputs = [model_dir, *(opts.calib or []), *(opts.held_out or [])]
    if opts.log_file:
        ensure_writable_output(opts.log_file, what="--log", inputs=inputs, replaced=[out_dir])
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(RunLog(opts.log_file, on_event, capture=opts.library_output == "log",
                                         setup_phase="check"))
        stack.enter_context(cuda_allocator_settings(log))
        with log.phase("check"):
            run = check_inputs(model_dir, out_dir, inputs, opts, log)
        warmups = start_warmups(run.device, run.config, current_backend())
        stack.callback(lambda: [log.info("warmup", line) for line in warmups.wait_all()])
        with log.phase("calibration"):
            data = prepare_calibration(model_dir, run, opts, log)
        with log.phase("load"):
            # On the CPU, as in GPTQModel's own loader: its looper moves one layer at a time to the GPU.
            sala = load_model(model_dir, dtype=torch.bfloat16, device="cpu", config=run.config)
        with log.phase("sanity"):
            if line := warmups.wait("fla"):
                log.info("sanity", line)
            sanity = sanity_check(sala, data.held_out, run.device, opts, log)
        stack.enter_context(use_backend(sanity.gla.backend))
        with log.phase("gptq"), engine.eager_block_update_while(
                warmups.threads.get("gptq-block-update") if opts.engine == "soarpack" else None):
            gptq = engine.run_gptq(sala, model_dir, data.rows, run.recipe, engine_options(run, opts), log.layer)
        if line := warmups.wait("gptq-block-update"):
            log.note("gptq", line)
        quantized = checked_quantized(gptq.packed, run)
        n_quantized, n_planned = len(quantized), len(run.recipe.plan(run.config))
        quality: Dict[str, Any] = {"gptq": gptq.module_losses}
        gptq_timings, gptq_counts = gptq.region_seconds, gptq.region_counts
        del sala, gptq
        with atomic_dir(out_dir, force=opts.force, inputs=inputs, log=lambda m: log.note("save", m)) as tmp:
            with log.phase("save"):
                save_checkpoint(quantized, model_dir, tmp, run, opts)
            del quantized
            if opts.quality:
                with log.phase("quality"):
                    quality["kl"] = measure_quality(tmp, data.held_out, sanity.ref_logprobs, run.device, log)
            if opts.verify:
                with log.phase("verify"):
                    quality["dequant_error"] = verify_written(tmp, model_dir, out_dir.name, run.device, log)
            result = QuantizeResult(
                out_dir=out_dir.name, recipe=run.recipe.name, device=run.device, rows=len(data.rows),
                held_out_rows=len(data.held_out), quantized_modules=n_quantized,
                skipped_modules=n_planned - n_quantized, sanity_loss=round(sanity.loss, 5),
                calibration={**run.calibration.model_dump(), "set_by": run.sources, **data.origin},
                timings={k: round(v, 3) for k, v in log.timings.items()},
                gptq_timings=gptq_timings, gptq_counts=gptq_counts, quality=quality,
                gla=sanity.gla.to_dict(), modules=module_bits(run), settings=report_settings(opts),
                versions=library_versions(), notes=list(log.notes))
            atomic_write_json(tmp / REPORT_FILE, {k: v for k, v in result.to_dict().items() if k != "library_warnings"})
        log.info("done", f"wrote {out_dir}: {n_quantized} quantized, {n_planned - n_quantized} kept 16-bit; "
                 + ", ".join(f"{k} {v:.1f}s" for k, v in log.timings.items()))
    result.library_warnings = log.library_warnings
    return result


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


def check_inputs(model_dir: Path, out_dir: Path, inputs: List[Path], opts: QuantizeOptions, log: "RunLog") -> Run:
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


def prepare_calibration(model_dir: Path, run: Run, opts: QuantizeOptions, log: "RunLog") -> CalibrationData:
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
                 log: "RunLog") -> Sanity:
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
                    log: "RunLog") -> Dict[str, float]:
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


def verify_written(ckpt: Path, model_dir: Path, output_name: str, device: str, log: "RunLog") -> Dict[str, float]:
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
def cuda_allocator_settings(log: "RunLog") -> Iterator[None]:
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


# -- progress ----------------------------------------------------------------------------------------------------


def _disk_full_cause(exc: BaseException) -> Optional[BaseException]:
    """The exception, or one it was raised from or during, that says the disk is full; None when none does."""
    from soarpack.placement.checks import is_disk_full

    seen = 0
    while exc is not None and seen < 16:
        if is_disk_full(exc):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


class RunLog:
    """Phase timings; events to the caller's callback and, when asked, plain lines to a log file, where the
    libraries' own output also goes while the run lasts (`capture`; nowhere without a log file). Each phase ends
    by handing the CUDA caching allocator's unused reserve back, so one phase's peak does not stay resident through
    the next.

    A phase that raises ends with its cause (`gptq interrupted after 26.0s`, not a finished phase's `gptq 26.0s`),
    and the log's last line says how the run ended. A run refused in its `setup_phase` (a mistyped recipe, a
    missing model, an existing output) did no work: the log it created is removed, not left as a stray file."""

    def __init__(self, log_file: Optional[Path], on_event: Optional[EventCallback], capture: bool = False,
                 setup_phase: Optional[str] = None):
        self.log_file, self.on_event, self.capture = log_file, on_event, capture
        self.setup_phase = setup_phase
        self.fh = None
        self.timings: Dict[str, float] = {}
        self.notes: List[str] = []
        self.current: Optional[str] = None  # the phase in progress (or the one that raised)
        self.finished: List[str] = []  # the phases that ended without an error
        self.layer_at: Optional[tuple] = None  # the last GPTQ layer started: (index, layers)
        self._in_setup = setup_phase is not None
        self._created = False
        self._exc: Optional[BaseException] = None
        self._t0 = self._layer_t0 = time.perf_counter()
        self._stack = contextlib.ExitStack()
        self.captured: Any = None  # soarpack.quant.capture.Captured while the libraries' output is captured

    @property
    def library_warnings(self) -> Optional[int]:
        """Warning lines the libraries wrote to the log (final once the RunLog is closed); None: not captured."""
        return None if self.captured is None or not self.log_file else self.captured.warnings

    def __enter__(self) -> "RunLog":
        from soarpack.quant.capture import library_output_to

        if self.log_file:
            self._created = not os.path.exists(self.log_file)
            self.fh = self._stack.enter_context(open(self.log_file, "a+", encoding="utf-8"))  # + : _write reads
            self._stack.callback(self._last_line)  # after the capture below is closed: nothing comes after it
        if self.capture:  # without a log file the libraries' output goes nowhere: a library call prints nothing
            self.captured = self._stack.enter_context(library_output_to(Path(self.log_file or os.devnull)))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        from soarpack.placement.checks import is_disk_full

        self._exc = exc
        closing: Optional[OSError] = None
        try:
            self._stack.close()  # the log and the libraries' capture: a full disk can refuse their last flush
        except OSError as close_exc:
            if not is_disk_full(close_exc):
                raise
            closing = close_exc
        removed = False
        if exc is not None and self._in_setup and self._created and self.log_file:
            with contextlib.suppress(OSError):
                os.unlink(self.log_file)
                removed = True
        if exc is None:
            if closing is not None:  # the output is in place; only the log's last lines are lost
                self._say_incomplete(closing)
            return
        if isinstance(exc, SoarpackError):
            return  # the run's own one-line error (an output refused for a full disk among them) stays the one shown
        full = _disk_full_cause(exc)
        if full is not None:  # the log, or a library writing into it, found the disk full: one line, no traceback
            log = f"; the log {self.log_file} is incomplete" if self.log_file and not removed else ""
            what = getattr(full, "filename", None) or "a write"
            raise SoarpackError(f"no space left on the device {self._where()} ({what} failed){log}",
                                "free disk space where the log and the output go, and run again; nothing was "
                                "replaced") from full

    def _where(self) -> str:
        return (f"in {self.current}" if self.current else f"after {self.finished[-1]}" if self.finished
                else "at the start")

    def _say_incomplete(self, exc: OSError) -> None:
        if self.on_event:
            self.on_event(Event("problem", "done", f"the log {self.log_file} is incomplete: its last lines did not fit "
                                                   f"on the device ({exc.strerror or exc})"))

    def _last_line(self) -> None:
        exc = self._exc
        if exc is None or (self._in_setup and self._created):
            return
        where = self._where()
        if self.current == "gptq" and self.layer_at:
            where += f" at layer {self.layer_at[0] + 1}/{self.layer_at[1]}"
        how = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else "failed"
        cause = "" if isinstance(exc, KeyboardInterrupt) else f": {ended_by(exc)}"
        with contextlib.suppress(OSError):  # a full disk: the run's own error is the one to show
            self._write(f"run {how} {where}, {time.perf_counter() - self._t0:.1f}s after it started{cause}")

    def _write(self, text: str) -> None:
        """One line of ours, on a line of its own even when a library left a bar unfinished in the file."""
        assert self.fh is not None
        self.fh.flush()
        fd = self.fh.fileno()
        size = os.fstat(fd).st_size
        first = "\n" if size and os.pread(fd, 1, size - 1) != b"\n" else ""
        self.fh.write(f"{first}{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        self.fh.flush()

    def emit(self, event: Event) -> None:
        if self.on_event:
            self.on_event(event)
        if self.fh:
            end = f"{event.phase} {event.message} after {event.seconds:.1f}s" if event.message \
                else f"{event.phase} {event.seconds:.1f}s"
            self._write({"start": f"{event.phase} ...", "end": end}.get(event.kind, event.message))

    def info(self, phase: str, message: str) -> None:
        self.emit(Event("info", phase, message))

    def note(self, phase: str, message: str) -> None:
        """A fallback the run took: shown even when quiet, and kept in the report."""
        self.notes.append(message)
        self.emit(Event("problem", phase, message))

    def layer(self, i: int, n: int) -> None:
        spent = time.perf_counter() - self._layer_t0
        eta = f", eta {spent / i * (n - i):.0f}s" if i else ""
        self.layer_at = (i, n)
        # counted from 1, as the bar counts: `layer 3/8 started` is the third (done = the 2 before it)
        self.emit(Event("progress", "gptq", f"gptq layer {i + 1}/{n} started after {spent:.1f}s{eta}", spent, i, n))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name != self.setup_phase:
            self._in_setup = False  # the work has started: its log stays, whatever happens next
        self.emit(Event("start", name))
        self.current = name
        t0 = self._layer_t0 = time.perf_counter()
        ended = ""
        try:
            yield
        except BaseException as exc:
            ended = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
            raise
        finally:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
            dt = time.perf_counter() - t0
            self.timings[name] = self.timings.get(name, 0.0) + dt
            if not ended:
                self.current = None
                self.finished.append(name)
            self.emit(Event("end", name, ended, seconds=dt))


def ended_by(exc: BaseException) -> str:
    """An exception as the one line a log or a terminal says about it."""
    text = exc.message if isinstance(exc, SoarpackError) else f"{type(exc).__name__}: {exc}"
    return (text.strip().splitlines() or [type(exc).__name__])[0]
