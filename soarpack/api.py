"""soarpack's Python API: each command a function derived from its typed request (soarpack/commands/), the fields
its parameters under the command line's names (`--sglang-src` is `sglang_src=`); here: what it does with the request.
They print nothing (progress goes to `on_event`; `soarpack.cli.output.Sink().event` renders it as the command does),
return typed results, raise `soarpack.errors.SoarpackError` for bad input (the command's `error:` and `hint:`), and
import heavy libraries (torch, GPTQModel, transformers) only when they run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Union

from soarpack.commands.bundle import BuildRequest, CheckRequest
from soarpack.commands.diagnosis import DiagnoseRequest
from soarpack.commands.measure import BenchRequest, CompareRequest, EvalRequest, ScoreRequest
from soarpack.commands.quantize import QuantizeRequest
from soarpack.commands.tiny import TinyModelRequest
from soarpack.request import api_function
from soarpack.steps import Event, EventCallback

if TYPE_CHECKING:  # the result types, imported for annotations only (their modules pull pydantic, httpx or torch)
    from soarpack.measure.results import BenchResult, CompareResult, EvalResult, ScoreResult
    from soarpack.bundle.build import BuildResult
    from soarpack.diagnosis import Diagnosis
    from soarpack.quant.run import QuantizeResult
    from soarpack.rehearse.check import CheckReport

__all__ = ["quantize", "build", "check", "eval", "bench", "score", "compare", "diagnose", "tiny_model"]


@api_function(QuantizeRequest)
def quantize(request: QuantizeRequest, on_event: EventCallback) -> QuantizeResult:
    """GPTQ-quantize a MiniCPM-SALA checkpoint with a recipe into a checkpoint SGLang's gptq_marlin serves.

    on_event gets each phase's start and end, a line, a GPTQ layer started. A refusal names the flag (`--rows`).

    Returns a soarpack.quant.run.QuantizeResult (quality: KL, top-1 agreement); `to_dict()` is OUT's report.

    Example:
        >>> tiny = soarpack.tiny_model("tiny", layers=2)
        >>> result = soarpack.quantize(tiny, "tiny-w4", recipe="w4-full", rows=8, max_len=64, device="cpu")
        >>> result.quantized_modules, result.quality["kl"]["kl_mean"]
    """
    from soarpack.quant import run as quant_run

    return quant_run.quantize(request.model_dir, request.out_dir, request.to_options(), on_event=on_event)


@api_function(BuildRequest)
def build(r: BuildRequest, on_event: EventCallback) -> BuildResult:
    """Build the submission .tar.gz: entry scripts, soarpack, the profile, calibration data, wheels, MANIFEST.json.

    Every input is checked before the slow parts (wheels, packing); the risk lines come as "problem" events.

    Returns a soarpack.bundle.build.BuildResult: path, id, manifest, risks, placed; `to_dict()` is `--json`'s.

    Example:
        >>> bundle = soarpack.build(profile="safe", calib=["my.jsonl"])
        >>> bundle.path, bundle.id
    """
    from soarpack.bundle.build import PLATFORM, build_bundle

    return build_bundle(r.output, profile=r.profile, recipe=r.recipe, sglang_src=r.sglang_src or PLATFORM,
                        calib=r.calib or (), rows=r.rows, wheels=r.wheels, wheel_dir=r.wheel_dir, force=r.force,
                        on_event=on_event)


@api_function(CheckRequest)
def check(r: CheckRequest, on_event: EventCallback) -> CheckReport:
    """Rehearse what the platform does with a bundle; every step passes, fails, or is skipped with its reason.

    Returns a soarpack.rehearse.check.CheckReport: uploadable, steps, risks, logs_dir (for soarpack.diagnose).

    Example:
        >>> report = soarpack.check(bundle.path, dev_stack=True)
        >>> report.uploadable, [(s.name, s.status) for s in report.steps]
    """
    from soarpack.bundle.build import newest_bundle
    from soarpack.rehearse.check import check_bundle

    bundle = r.bundle
    if bundle is None:
        bundle = newest_bundle()
        on_event(Event("info", "bundle", f"bundle: {bundle}"))
    return check_bundle(bundle, rehearse=r.rehearse, sglang_src=r.sglang_src, work_dir=r.keep, keep=r.keep is not None,
                        dev_stack=r.dev_stack, accept_risk=r.accept_risk, strict=r.strict, on_event=on_event)


def _configured(request: Union[EvalRequest, BenchRequest], on_event: EventCallback, check_config: Callable):
    """The request's config, checked before the bundle's identity (read from its MANIFEST) is recorded in it."""
    cfg = request.to_config()
    check_config(cfg)
    if request.bundle is not None:
        from soarpack.bundle.summary import inspect_bundle

        cfg.bundle = summary = inspect_bundle(request.bundle)
        on_event(Event("info", "bundle", f"bundle {summary['id']} ({summary['profile']}, recipe {summary['recipe']})"))
    return cfg


@api_function(EvalRequest)
def eval(request: EvalRequest, on_event: EventCallback) -> EvalResult:
    """Score a running server on the correctness set as the platform's eval_model.py does.

    A failed request scores 0; a resumed `output` sends only its unscored or failed rows; nothing is written
    without `output`. on_event gets "progress" per scored row (`data`: its record).

    Returns a soarpack.measure.results.EvalResult: ori_accuracy, c_factor, failed, `gate()`; `to_dict()`: the JSON.

    Example:
        >>> result = soarpack.eval(api_base="http://127.0.0.1:30000", data="perf_public_set.jsonl",
        ...                        model_dir="sala-w4", rows=50, output="eval.json")
        >>> result.ori_accuracy, result.c_factor
    """
    from soarpack.measure.evaluate import check_eval_config, run_eval
    from soarpack.measure.results import EvalResult

    cfg = _configured(request, on_event, check_eval_config)
    if cfg.model_dir is None:
        on_event(Event("info", "eval", "note: no --model-dir: requests carry no stop strings (the platform sends the "
                                       "model's eos tokens)"))
    return EvalResult.from_report(run_eval(cfg, on_event), cfg.output)


@api_function(BenchRequest)
def bench(request: BenchRequest, on_event: EventCallback) -> BenchResult:
    """Time the S1, S8 and Smax tiers against a running server with the platform's bench_serving semantics.

    Each tier: a warm-up request, POST /flush_cache, a settle pause, the timed run (concurrency 1, 8, unbounded);
    `output` is replaced once every tier finished. on_event gets "progress" per finished request (phase = tier).

    Returns a soarpack.measure.results.BenchResult: tiers (name -> BenchTier), complete; `to_dict()`: the JSON.

    Example:
        >>> result = soarpack.bench(api_base="http://127.0.0.1:30000", model_dir="sala-w4",
        ...                         s1="s1.jsonl", s8="s8.jsonl", smax="smax.jsonl", output="bench.json")
        >>> {name: tier.duration_s for name, tier in result.tiers.items()}
    """
    from soarpack.measure.results import BenchResult
    from soarpack.measure.speed import check_bench_config, run_bench

    cfg = _configured(request, on_event, check_bench_config)
    return BenchResult.from_report(run_bench(cfg, on_event), cfg.output)


@api_function(ScoreRequest)
def score(r: ScoreRequest, on_event: EventCallback) -> ScoreResult:
    """The competition's final score: (0.4 S1 + 0.3 S8 + 0.3 Smax) x C, with S = 100 x best / ours per tier.

    The best durations are the leaderboard's (which soarpack cannot see): a bench JSON, or seconds per tier.
    Raises soarpack.errors.InputDataError when a best time or a tier is missing, or a tier had failures.

    Returns a soarpack.measure.results.ScoreResult: tier_scores, speed_score, c_factor, final_score, ours_s, best_s.

    Example:
        >>> soarpack.score(ours="bench.json", eval="eval.json", best_s1=30, best_s8=60, best_smax=90)
    """
    from soarpack.measure.competition import durations_from_bench, final_score, overall_from_eval
    from soarpack.measure.results import ScoreResult

    best = {**(durations_from_bench(r.best) if r.best is not None else {}), **r.best_given()}
    overall = overall_from_eval(r.eval) if r.eval is not None else None
    return ScoreResult(**final_score(durations_from_bench(r.ours), best, overall))


@api_function(CompareRequest)
def compare(request: CompareRequest, on_event: EventCallback) -> CompareResult:
    """Runs side by side: ori, margin, interval, C, S1/S8/Smax, final, and each run's gate.

    The files are grouped into runs by their label (else the served model); S = 100 x best / ours, best the
    fastest compared run's time unless given. on_event gets an "info" event naming the chart written.

    Returns a soarpack.measure.results.CompareResult: runs, below_gate, at_risk; `render("md" | "csv" | "table")`.

    Example:
        >>> runs = soarpack.compare(["eval-a.json", "bench-a.json", "eval-b.json", "bench-b.json"])
        >>> print(runs.render("md")); runs.below_gate
    """
    from soarpack.bundle.risks import evidence_risk_lines
    from soarpack.measure.compare import load_runs, score_runs
    from soarpack.measure.results import CompareResult

    paths = list(request.results or [])
    runs = load_runs(paths, risks=evidence_risk_lines)
    best = score_runs(runs, request.best_given())
    if request.chart is not None:
        from soarpack.measure.chart import write_chart

        on_event(Event("info", "chart", f"wrote {write_chart(runs, request.chart, inputs=paths)}"))
    return CompareResult(runs, best)


@api_function(DiagnoseRequest)
def diagnose(request: DiagnoseRequest) -> Diagnosis:
    """Name the known failures in a run's logs and results (soarpack/diagnosis/catalogue.toml), with cause and fix.

    Returns a soarpack.diagnosis.Diagnosis: findings (`entry(finding)`: title, cause, fix, sources), exit_code.

    Example:
        >>> found = soarpack.diagnose([report.logs_dir]); [found.entry(f).fix for f in found.findings]
    """
    from soarpack.diagnosis import diagnose as diagnose_paths

    return diagnose_paths(request.paths or [])


@api_function(TinyModelRequest)
def tiny_model(r: TinyModelRequest) -> Path:
    """Write a tiny random MiniCPM-SALA checkpoint in the exact Hugging Face layout; return its path.

    Config, tokenizer, chat template and shards, quick to quantize on a CPU: to try the commands without the model.
    The request refused a shape out of bounds before torch is imported.

    Example:
        >>> tiny = soarpack.tiny_model("tiny", pattern="SLLS")
    """
    from soarpack.sala.tiny import make_tiny_model

    return make_tiny_model(r.out, num_layers=r.layers, mixer_types=r.kinds(), hidden_size=r.hidden,
                           intermediate_size=r.intermediate, num_attention_heads=r.heads, lightning_nh=r.heads,
                           num_key_value_heads=r.kv_heads, vocab_size=r.vocab, seed=r.seed, force=r.force)
