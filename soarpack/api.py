"""soarpack's Python API: the commands `quantize`, `build`, `check`, `eval`, `bench`, `score`, `compare`, `diagnose`
(and `tiny_model`) as functions, with the command line's names (`--sglang-src` is `sglang_src=`, `-n/--rows` is
`rows=`, `-o/--output` is `output=`).

Each function is derived from its command's typed request (soarpack/commands/): its keywords, their defaults,
their help() lines and their old names are the request's fields (soarpack.request.api_function). What is written
here is what each command does with its request, and the prose of its help().

They print nothing: progress goes to an optional `on_event` callback (one `soarpack.steps.Event` per phase start,
end, line or progress count), results come back typed, and bad input raises `soarpack.errors.SoarpackError` (its
`message` and `hint` are what the command prints as `error:` and `hint:`). The CLI is a thin layer over these;
`on_event=soarpack.cli.output.Sink().event` renders the events as the command does.

Heavy libraries (torch, GPTQModel, transformers) are imported when a function runs, never by `import soarpack`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

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


def _run_quantize(request: QuantizeRequest, on_event: EventCallback) -> QuantizeResult:
    from soarpack.quant import run as quant_run

    return quant_run.quantize(request.model_dir, request.out_dir, request.to_options(), on_event=on_event)


quantize = api_function(QuantizeRequest, "quantize", _run_quantize, positional=2, about="""GPTQ-quantize a \
MiniCPM-SALA checkpoint with a recipe into a checkpoint SGLang's gptq_marlin serves.

    The same as `soarpack quantize MODEL_DIR OUT`. The output directory is written atomically, with the run's
    report in OUT/soarpack_quant_report.json. Nothing is printed; on_event gets each phase's start and end, a line,
    a GPTQ layer started. A refusal names the flag (`--rows`).""", returns="""Returns a \
soarpack.quant.run.QuantizeResult: recipe, device, rows, quantized_modules, skipped_modules,
    sanity_loss, calibration (rows asked and used, and who set each setting), timings, quality (KL mean/max, top-1
    agreement, per-module dequantization error), modules, notes (fallbacks taken); `to_dict()` is the report.""",
    example="""        >>> tiny = soarpack.tiny_model("tiny", layers=2)
        >>> result = soarpack.quantize(tiny, "tiny-w4", recipe="w4-full", rows=8, max_len=64, device="cpu")
        >>> result.quantized_modules, result.quality["kl"]["kl_mean"]""")


def _run_build(request: BuildRequest, on_event: EventCallback) -> BuildResult:
    from soarpack.bundle.build import PLATFORM, build_bundle

    return build_bundle(request.output, profile=request.profile, recipe=request.recipe,
                        sglang_src=request.sglang_src or PLATFORM, calib=request.calib or (), rows=request.rows,
                        wheels=request.wheels, wheel_dir=request.wheel_dir, force=request.force, on_event=on_event)


build = api_function(BuildRequest, "build", _run_build, about="""Build the submission .tar.gz: entry scripts, \
soarpack, the profile, calibration data, wheels, MANIFEST.json.

    The same as `soarpack build`. Every input is checked before the slow parts (the wheels, cached once, and the
    packing). Nothing is printed; the risk lines the command prints come as "problem" events and in `risks`.""",
    returns="""Returns a soarpack.bundle.build.BuildResult: path, size, id, manifest, warnings, risks, placed \
("created",
    "replaced" or "up-to-date"); `to_dict()` is what `--json` prints.""", example="""\
        >>> bundle = soarpack.build(profile="safe", calib=["my.jsonl"])
        >>> bundle.path, bundle.id""")


def _run_check(request: CheckRequest, on_event: EventCallback) -> CheckReport:
    from soarpack.rehearse.check import check_bundle

    bundle = request.bundle
    if bundle is None:
        from soarpack.bundle.build import newest_bundle

        bundle = newest_bundle()
        on_event(Event("info", "bundle", f"bundle: {bundle}"))
    return check_bundle(bundle, rehearse=request.rehearse, sglang_src=request.sglang_src, work_dir=request.keep,
                        keep=request.keep is not None, dev_stack=request.dev_stack, accept_risk=request.accept_risk,
                        strict=request.strict, on_event=on_event)


check = api_function(CheckRequest, "check", _run_check, positional=1, about="""Rehearse what the platform does \
with a bundle; every step passes, fails, or is skipped with its reason.

    The same as `soarpack check BUNDLE`: safe extraction, size, hashes, credentials, wheel tags, then (unless
    `rehearse=False`) prepare_env.sh sourced on a stand-in of the image's Python stack and a tiny model quantized
    and verified. Nothing is printed; a step's "end" event carries its StepResult. `dev_stack=True` is never
    "uploadable"; `strict=True` blocks on every risk not accepted.""", returns="""Returns a \
soarpack.rehearse.check.CheckReport: `uploadable`, `steps` (name, status, detail, seconds),
    `risks`, `gate()`, `logs_dir` (a failed rehearsal's kept logs, for `soarpack.diagnose`); `to_dict()` is
    what `--json` prints.""", example="""        >>> report = soarpack.check(bundle.path, dev_stack=True)
        >>> report.uploadable, [(s.name, s.status) for s in report.steps]""")


def _bundle_identity(bundle: Optional[Path], on_event: EventCallback) -> Optional[dict]:
    """What a result records of `bundle` (read from its MANIFEST); a bad bundle stops the run before any request."""
    if bundle is None:
        return None
    from soarpack.bundle.summary import inspect_bundle

    summary = inspect_bundle(bundle)
    on_event(Event("info", "bundle", f"bundle {summary['id']} ({summary['profile']}, recipe {summary['recipe']})"))
    return summary


def _run_eval(request: EvalRequest, on_event: EventCallback) -> EvalResult:
    from soarpack.measure.evaluate import check_eval_config, run_eval
    from soarpack.measure.results import EvalResult

    cfg = request.to_config()
    check_eval_config(cfg)  # bad settings are refused before the bundle is read
    cfg.bundle = _bundle_identity(request.bundle, on_event)
    if cfg.model_dir is None:
        on_event(Event("info", "eval", "note: no --model-dir: requests carry no stop strings (the platform sends the "
                                       "model's eos tokens)"))
    return EvalResult.from_report(run_eval(cfg, on_event), cfg.output)


eval = api_function(EvalRequest, "eval", _run_eval, about="""Score a running server on the correctness set as \
the platform's eval_model.py does.

    The same as `soarpack eval`. One chat-completions request per row, at most `concurrency` in flight; a failed
    request scores 0. An existing `output` is resumed (only its unscored or failed rows are sent) when it was
    measured against the same server and model, from the same data. Nothing is written without `output`, nothing
    printed; on_event gets a "progress" event per scored row (its `data` is the row's record).""",
    returns="""Returns a soarpack.measure.results.EvalResult: ori_accuracy, overall_accuracy, c_factor (C < 1 \
loses score),
    total, scored, failed, complete, per_task, `gate()`, `rows`; `to_dict()` is the result JSON.""",
    example="""        >>> result = soarpack.eval(api_base="http://127.0.0.1:30000", data="perf_public_set.jsonl",
        ...                        model_dir="sala-w4", rows=50, output="eval.json")
        >>> result.ori_accuracy, result.c_factor""")


def _run_bench(request: BenchRequest, on_event: EventCallback) -> BenchResult:
    from soarpack.measure.results import BenchResult
    from soarpack.measure.speed import check_bench_config, run_bench

    cfg = request.to_config()
    check_bench_config(cfg)  # bad settings are refused before the bundle is read
    cfg.bundle = _bundle_identity(request.bundle, on_event)
    return BenchResult.from_report(run_bench(cfg, on_event), cfg.output)


bench = api_function(BenchRequest, "bench", _run_bench, about="""Time the S1, S8 and Smax tiers against a running \
server with the platform's bench_serving semantics.

    The same as `soarpack bench`. Each tier: one warm-up request, POST /flush_cache, a settle pause, then the timed
    run (concurrency 1, 8, unbounded); a tier without its file is skipped, as on the platform. `output` is replaced
    only when every tier finished; until then the finished tiers are in OUTPUT.partial.json. Nothing is written
    without `output`, nothing printed; on_event gets "progress" per finished request (phase = tier).""",
    returns="""Returns a soarpack.measure.results.BenchResult: tiers (name -> BenchTier: duration_s, completed, \
failed,
    short_outputs, output_throughput, metrics), complete; `to_dict()` is the result JSON.""",
    example="""        >>> result = soarpack.bench(api_base="http://127.0.0.1:30000", model_dir="sala-w4",
        ...                         s1="s1.jsonl", s8="s8.jsonl", smax="smax.jsonl", output="bench.json")
        >>> {name: tier.duration_s for name, tier in result.tiers.items()}""")


def _run_score(request: ScoreRequest, on_event: EventCallback) -> ScoreResult:
    from soarpack.measure.competition import durations_from_bench, final_score, overall_from_eval
    from soarpack.measure.results import ScoreResult

    best = durations_from_bench(request.best) if request.best is not None else {}
    overall = overall_from_eval(request.eval) if request.eval is not None else None
    return ScoreResult(**final_score(durations_from_bench(request.ours), {**best, **request.best_given()}, overall))


score = api_function(ScoreRequest, "score", _run_score, about="""The competition's final score: (0.4 S1 + 0.3 S8 \
+ 0.3 Smax) x C, with S = 100 x best / ours per tier.

    The same as `soarpack score`. The best durations are the fastest submission's on the leaderboard (which
    soarpack cannot see): give a bench JSON holding them, or the seconds per tier; a single number overrides the
    file's tier. Raises soarpack.errors.InputDataError when a best time or a tier is missing, or a bench tier had
    failures.""", returns="""Returns a soarpack.measure.results.ScoreResult: tier_scores, speed_score, c_factor, \
final_score, ours_s, best_s.""",
    example="""        >>> soarpack.score(ours="bench.json", eval="eval.json", best_s1=30, best_s8=60, best_smax=90)""")


def _run_compare(request: CompareRequest, on_event: EventCallback) -> CompareResult:
    from soarpack.measure.compare import load_runs, score_runs
    from soarpack.measure.results import CompareResult
    from soarpack.bundle.risks import evidence_risk_lines

    paths = list(request.results or [])
    runs = load_runs(paths, risks=evidence_risk_lines)
    best = score_runs(runs, request.best_given())
    if request.chart is not None:
        from soarpack.measure.chart import write_chart

        on_event(Event("info", "chart", f"wrote {write_chart(runs, request.chart, inputs=paths)}"))
    return CompareResult(runs, best)


compare = api_function(CompareRequest, "compare", _run_compare, positional=1, about="""Runs side by side: ori, \
margin, interval, C, S1/S8/Smax, final, and each run's gate.

    The same as `soarpack compare RESULTS...`. The eval and bench JSON files are grouped into runs by their label
    (else the served model); S = 100 x best / ours with best the fastest compared run's time, or the given ones.
    on_event gets an "info" event naming the chart written.""", returns="""Returns a \
soarpack.measure.results.CompareResult: runs (soarpack.measure.compare.Run: accuracy, gate, c,
    scores, final, below_gate, at_risk), best_s, below_gate, at_risk; `render("md")` is the table the command
    prints (`table`, `md`, `csv` or `json`).""",
    example="""        >>> runs = soarpack.compare(["eval-a.json", "bench-a.json", "eval-b.json", "bench-b.json"])
        >>> print(runs.render("md")); runs.below_gate""")


def _run_diagnose(request: DiagnoseRequest) -> Diagnosis:
    from soarpack.diagnosis import diagnose as diagnose_paths

    return diagnose_paths(request.paths or [])


diagnose = api_function(DiagnoseRequest, "diagnose", _run_diagnose, positional=1, events=False, about="""Name the \
known failures in a run's logs and results, with their cause and fix.

    The same as `soarpack diagnose LOG_OR_DIR...`. Reads logs (prepare_env.log, prepare_model.log, quantize.log, a
    server log), soarpack eval/bench JSON, or folders of them (a kept `check` folder, CheckReport.logs_dir), and
    matches the catalogue of known failures (soarpack/diagnosis/catalogue.toml, each citing its source).""",
    returns="""Returns a soarpack.diagnosis.Diagnosis: findings (each with `entry(finding)`: title, cause, fix, \
sources),
    excerpts (first error and last traceback of a log nothing known explains), exit_code (0 nothing found, 1 a
    known failure); `to_dict()` is what `--json` prints.""", example="""\
        >>> found = soarpack.diagnose([report.logs_dir])
        >>> [(f.entry_id, found.entry(f).fix) for f in found.findings]""")


def _run_tiny_model(request: TinyModelRequest) -> Path:
    from soarpack.sala.tinyshape import check_tiny_shape, mixer_types

    r = request
    kinds = mixer_types(r.pattern)
    check_tiny_shape(layers=len(kinds) if kinds else r.layers, hidden=r.hidden, intermediate=r.intermediate,
                     heads=r.heads, kv_heads=r.kv_heads, vocab=r.vocab)  # before torch is imported
    from soarpack.sala.tiny import make_tiny_model
    return make_tiny_model(r.out, num_layers=r.layers, mixer_types=kinds, hidden_size=r.hidden,
                           intermediate_size=r.intermediate, num_attention_heads=r.heads, num_key_value_heads=r.kv_heads,
                           lightning_nh=r.heads, vocab_size=r.vocab, seed=r.seed, force=r.force)


tiny_model = api_function(TinyModelRequest, "tiny_model", _run_tiny_model, positional=1, events=False, about="""\
Write a tiny random MiniCPM-SALA checkpoint in the exact Hugging Face layout; return its path.

    The same as `soarpack tiny-model OUT`: config, tokenizer (trained to `vocab`), chat template and shards,
    small enough to quantize on a CPU in seconds. For trying quantize, build and check without the real model.
    The directory is written atomically.""", returns="Returns the checkpoint's directory (a pathlib.Path).",
    example="""        >>> tiny = soarpack.tiny_model("tiny", pattern="SLLS")""")
