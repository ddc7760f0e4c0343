"""CLI commands of soarpack.bench: eval, bench, speedset, score, compare. Logic lives in soarpack.bench.

Tables go to stdout (`> score.txt` keeps them); progress, notes and errors go to stderr. With --json, stdout holds
only the JSON and the table goes to stderr.
"""

from __future__ import annotations

import enum
import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import typer

from soarpack.cli import command, err_console, renamed, required
from soarpack.errors import SoarpackError

_API_HELP = "Server address with its scheme, e.g. http://127.0.0.1:30000."
_LABEL_HELP = "What is measured, in your words (e.g. 'w4-mlp seed 1'); recorded in the result."
_BUNDLE_HELP = "The bundle the server's checkpoint came from: its sha256, profile and recipe are recorded."


def _bundle_identity(bundle: Optional[Path]) -> Optional[dict]:
    """What a result records of --bundle (read from its MANIFEST); a bad bundle stops the run before any request."""
    if bundle is None:
        return None
    from soarpack.bundle.summary import inspect_bundle

    return inspect_bundle(bundle)
PLAIN_PROGRESS_EVERY_S = 30.0


class IncompleteRunError(SoarpackError):
    """A measurement ran but some requests failed: its numbers are not the server's."""

    exit_code = 1


class BelowGateError(SoarpackError):
    """A run fails the accuracy gate (C < 1: less than full credit) or its eval is incomplete: a no-go."""

    exit_code = 1


def _table_console(as_json: bool):
    from rich.console import Console

    return Console(stderr=as_json)


def _say(message: str) -> None:
    err_console.print(message, markup=False, highlight=False, soft_wrap=True)


@contextmanager
def progress_bars(label: str) -> Iterator[Callable[[str, int, Optional[int], str], None]]:
    """update(name, done, total, note): a live bar on a terminal; else a plain line every 30 s (a log, CI)."""
    if err_console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[note]}"), console=err_console, transient=True) as progress:
            bars = {}

            def update(name: str, done: int, total: Optional[int], note: str = "") -> None:
                if name not in bars:
                    bars[name] = progress.add_task(name, total=total, note="")
                progress.update(bars[name], completed=done, total=total, note=note)

            yield update
        return
    start, last = time.monotonic(), {}

    def update(name: str, done: int, total: Optional[int], note: str = "") -> None:
        now = time.monotonic()
        if done == total or now - last.get(name, start) >= PLAIN_PROGRESS_EVERY_S:
            last[name] = now
            _say(f"{label} {name}: {done}/{total} after {now - start:.0f} s" + (f"  {note}" if note else ""))

    yield update


@command("eval")
def eval_cmd(
    api_base: str = typer.Option(..., "--api-base", metavar="URL", help=_API_HELP),
    data: Path = typer.Option(..., "--data", metavar="FILE",
                              help="JSONL with {task, question, gold} per line (perf_public_set.jsonl)."),
    model_dir: Optional[Path] = typer.Option(None, "--model-dir", metavar="DIR",
                                             help="Served model dir: stop strings come from its generation config "
                                                  "and tokenizer, as on the platform."),
    concurrency: int = typer.Option(32, "--concurrency", metavar="N", min=1, help="Requests in flight at most."),
    rows: Optional[int] = typer.Option(None, "-n", "--rows", metavar="N", min=1, help="Only the first N rows."),
    timeout: float = typer.Option(3000.0, "--timeout", metavar="SECONDS",
                                  help="Per-request timeout (> 0); a timeout scores 0."),
    stall_timeout: float = typer.Option(60.0, "--stall-timeout", metavar="SECONDS",
                                        help="Fail a request whose reply has started but then sends no byte for "
                                             "this long (waiting for it to start is bounded by --timeout)."),
    retries: int = typer.Option(0, "--retries", metavar="N",
                                help="Send a failed request again up to N times (the platform does not retry: "
                                     "a failed row scores 0). The report gives the accuracy with and without."),
    max_tokens: int = typer.Option(65536, "--max-tokens", metavar="N",
                                   help="max_tokens per request, at least 1 (the platform sends 65536)."),
    output: Path = typer.Option(Path("eval.json"), "-o", "--output", metavar="FILE",
                                help="Result JSON. An existing one is resumed only if it was measured against the "
                                     "same --api-base and model, from the same data."),
    resume: bool = typer.Option(False, "--resume",
                                help="Resume OUTPUT although its server or model differ (e.g. the same "
                                     "checkpoint on another port); the file lists both servers. Rows asked of "
                                     "another model id are sent again."),
    force: bool = typer.Option(False, "--force",
                               help="Start OUTPUT over; the old file is kept beside as NAME.old-N.json."),
    label: Optional[str] = typer.Option(None, "--label", metavar="TEXT", help=_LABEL_HELP),
    bundle: Optional[Path] = typer.Option(None, "--bundle", metavar="TARBALL", help=_BUNDLE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    old_model_path: Optional[Path] = typer.Option(None, "--model-path", hidden=True),
    old_num_samples: Optional[int] = typer.Option(None, "--num-samples", min=1, hidden=True),
) -> None:
    """Score a running server on the correctness set as the platform's eval_model.py does.

    Exits 1 when any request failed (the run is incomplete; run it again to resend the failed rows).

    Example:

    \b
      soarpack eval --api-base http://127.0.0.1:30000 \\
        --data perf_public_set.jsonl --model-dir Q -o eval.json
    """
    from rich.markup import escape

    from soarpack.bench.evaluate import EvalConfig, check_eval_config, run_eval
    from soarpack.bench.render import print_eval

    model_dir = renamed(model_dir, old_model_path, "--model-dir", "--model-path")
    rows = renamed(rows, old_num_samples, "--rows", "--num-samples")
    cfg = EvalConfig(api_base=api_base, data=data, output=output, model_dir=model_dir, concurrency=concurrency,
                     num_samples=rows, timeout_s=timeout, max_tokens=max_tokens, stall_s=stall_timeout,
                     retries=retries, resume=resume, force=force, label=label, bundle=_bundle_identity(bundle))
    check_eval_config(cfg)
    if model_dir is None:
        _say("note: no --model-dir: requests carry no stop strings (the platform sends the model's eos tokens)")
    scores = []
    with progress_bars("eval") as update:
        def on_result(record: dict, done: int, total: int) -> None:
            scores.append(record["score"])
            note = f"mean {100 * sum(scores) / len(scores):.1f}" + (f"  {escape(record['error'])}" if record["error"] else "")
            update("rows", done, total, note)

        report = run_eval(cfg, on_result, note=_say)
    print_eval(_table_console(as_json), report)
    _say(f"wrote {output}")
    if as_json:
        typer.echo(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=2))
    if report["failed"]:
        raise IncompleteRunError(f"eval incomplete: {report['failed']} of {report['total']} requests failed "
                                 "(they score 0, as on the platform)",
                                 "fix the server and run the same command again: only the failed rows are sent")
    if report["c_factor"] < 1:
        raise BelowGateError(f"below the accuracy gate: ori {report['ori_accuracy']:.2f} (overall "
                             f"{report['overall_accuracy']:.2f}) gives C = {report['c_factor']}; full credit needs "
                             "ori > 79.2", "this checkpoint would lose score on the platform: try a safer recipe")


@command("bench")
def bench_cmd(
    api_base: str = typer.Option(..., "--api-base", metavar="URL", help=_API_HELP),
    s1: Optional[Path] = typer.Option(None, "--s1", metavar="FILE",
                                      help="Speed JSONL for S1 (concurrency 1); tier skipped if absent."),
    s8: Optional[Path] = typer.Option(None, "--s8", metavar="FILE", help="Speed JSONL for S8 (concurrency 8)."),
    smax: Optional[Path] = typer.Option(None, "--smax", metavar="FILE", help="Speed JSONL for Smax (no cap)."),
    model_dir: Optional[Path] = typer.Option(None, "--model-dir", metavar="DIR",
                                             help="Served model dir whose tokenizer counts max_new_tokens (default: "
                                                  "the served model id, if it is a local dir)."),
    output: Path = typer.Option(Path("bench.json"), "-o", "--output", metavar="FILE",
                                help="Result JSON (what score and compare read)."),
    seed: int = typer.Option(1, "--seed", metavar="N", help="Shuffle seed (the platform uses 1)."),
    rows: Optional[int] = typer.Option(None, "-n", "--rows", metavar="N", min=1,
                                       help="Only the first N rows after shuffling."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="One warm-up request per tier, as the platform."),
    flush: bool = typer.Option(True, "--flush/--no-flush", help="POST /flush_cache before each tier, as the platform."),
    settle: float = typer.Option(1.0, "--settle", metavar="SECONDS", min=0.0,
                                 help="Wait after the flush before timing (bench_serving waits 1)."),
    stall_timeout: float = typer.Option(600.0, "--stall-timeout", metavar="SECONDS",
                                        help="Fail a request whose stream sends no byte for this long."),
    label: Optional[str] = typer.Option(None, "--label", metavar="TEXT", help=_LABEL_HELP),
    bundle: Optional[Path] = typer.Option(None, "--bundle", metavar="TARBALL", help=_BUNDLE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
    old_tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", hidden=True),
    old_num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, hidden=True),
) -> None:
    """Time S1, S8 and Smax against a running server with the platform's bench_serving semantics.

    The output is replaced only when every tier finished; until then tiers go to OUTPUT.partial.json. Exits 1 when
    a tier had failed requests or outputs shorter than asked (score refuses such a tier).

    Example:

    \b
      soarpack bench --api-base http://127.0.0.1:30000 \\
        --s1 s1.jsonl --s8 s8.jsonl --smax smax.jsonl
    """
    from soarpack.bench.render import print_bench
    from soarpack.bench.speed import BenchConfig, check_bench_config, partial_path, run_bench

    model_dir = renamed(model_dir, old_tokenizer, "--model-dir", "--tokenizer")
    rows = renamed(rows, old_num_prompts, "--rows", "--num-prompts")
    tiers = {name: path for name, path in (("s1", s1), ("s8", s8), ("smax", smax)) if path is not None}
    cfg = BenchConfig(api_base=api_base, tiers=tiers, tokenizer_dir=model_dir, output=output, seed=seed,
                      num_prompts=rows, warmup=warmup, flush_cache=flush, settle_s=settle, stall_s=stall_timeout,
                      label=label, bundle=_bundle_identity(bundle))
    check_bench_config(cfg)
    with progress_bars("bench") as update:
        try:
            report = run_bench(cfg, lambda tier, done, total: update(tier, done, total, ""))
        except KeyboardInterrupt:
            _say(f"interrupted: {output} was left as it was; finished tiers are in {partial_path(output)}")
            raise typer.Exit(130) from None
    print_bench(_table_console(as_json), report)
    _say(f"wrote {output}")
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    bad = {name: tier for name, tier in report["tiers"].items() if tier["failed"] or tier["short_outputs"]}
    if bad:
        raise IncompleteRunError("bench incomplete: " + "; ".join(
            f"{name} had {tier['failed']} failed and {tier['short_outputs']} short request(s)" for name, tier in bad.items()),
            "score refuses these tiers; check the server log (and that it honours ignore_eos)")


@command("speedset")
def speedset_cmd(
    model_dir: Optional[Path] = typer.Option(None, "--model-dir", metavar="DIR",
                                             help="The served model's dir, whose tokenizer counts the lengths. "
                                                  "[required]"),
    rows: int = typer.Option(..., "-n", "--rows", metavar="N", min=1, help="Number of rows."),
    output: Path = typer.Option(..., "-o", "--output", metavar="FILE",
                                help="JSONL to write ({question, model_response} per line)."),
    mix: Optional[Path] = typer.Option(None, "--mix", metavar="FILE",
                                       help="Length mix, TOML or JSON: [[input]] and [[output]] buckets with min, "
                                            "max, share. Default: the published mix."),
    text: Optional[Path] = typer.Option(None, "--text", metavar="FILE",
                                        help="UTF-8 text to cut rows from (default: built-in prose)."),
    seed: int = typer.Option(1, "--seed", metavar="N", help="Seed for lengths and text."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    old_tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", hidden=True),
) -> None:
    """Write a speed set that follows the published input/output length mix.

    Example:

    \b
      soarpack speedset --model-dir Q -n 400 -o speed.jsonl
    """
    from soarpack.bench import speedset as ss
    from soarpack.bench.render import print_speedset
    from soarpack.bench.tokenizer import load_tokenizer
    from soarpack.errors import OutputExistsError
    from soarpack.fsutil import ensure_writable_output

    model_dir = required(renamed(model_dir, old_tokenizer, "--model-dir", "--tokenizer"), "--model-dir")
    ensure_writable_output(output, what="speedset output")
    if output.exists() and not force:
        raise OutputExistsError(f"{output} exists", "pass --force to replace it")
    buckets = ss.load_mix(mix)
    table_rows, summary = ss.make_speedset(load_tokenizer(model_dir), rows, buckets, seed, ss.speedset_text(text))
    ss.write_jsonl(output, table_rows)
    hist = {"input": ss.bucket_histogram(summary.input_tokens, buckets["input"]),
            "output": ss.bucket_histogram(summary.output_tokens, buckets["output"])}
    print_speedset(_table_console(as_json), buckets, hist, summary)
    _say(f"wrote {output}")
    if as_json:
        typer.echo(json.dumps({"output": str(output), "rows": summary.rows, "max_abs_error": summary.max_abs_error,
                               "histogram": hist}, indent=2))


@command("score")
def score_cmd(
    ours: Path = typer.Option(..., "--ours", metavar="FILE", help="Our bench JSON (soarpack bench -o)."),
    eval_json: Optional[Path] = typer.Option(None, "--eval", metavar="FILE",
                                             help="Our eval JSON; without it C = 1 is assumed."),
    best: Optional[Path] = typer.Option(None, "--best", metavar="FILE", help="A bench JSON holding the best durations."),
    best_s1: Optional[float] = typer.Option(None, "--best-s1", metavar="SECONDS",
                                            help="Best S1 duration (overrides --best)."),
    best_s8: Optional[float] = typer.Option(None, "--best-s8", metavar="SECONDS", help="Best S8 duration."),
    best_smax: Optional[float] = typer.Option(None, "--best-smax", metavar="SECONDS", help="Best Smax duration."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """The competition's final score: (0.4 S1 + 0.3 S8 + 0.3 Smax) x C, with S = 100 x best / ours.

    Example:

    \b
      soarpack score --ours bench.json --eval eval.json \\
        --best-s1 30 --best-s8 60 --best-smax 90
    """
    from soarpack.bench.competition import durations_from_bench, final_score, overall_from_eval
    from soarpack.bench.render import print_score

    best_durations = durations_from_bench(best) if best is not None else {}
    for tier, value in (("s1", best_s1), ("s8", best_s8), ("smax", best_smax)):
        if value is not None:
            best_durations[tier] = value
    overall = overall_from_eval(eval_json) if eval_json is not None else None
    result = final_score(durations_from_bench(ours), best_durations, overall)
    print_score(_table_console(as_json), result)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    if result["c_factor"] < 1:
        raise BelowGateError(f"C = {result['c_factor']} (overall accuracy {result['overall_accuracy']}): final "
                             f"{result['final_score']:.2f} is below full credit", "C = 1 needs ori accuracy > 79.2")


class CompareFormat(str, enum.Enum):
    table = "table"
    md = "md"
    csv = "csv"
    json = "json"


@command("compare")
def compare_cmd(
    # Described in the docstring: Typer prints a list argument's type as `<list[Path]>`.
    results: List[Path] = typer.Argument(..., metavar="RESULTS", hidden=True),
    fmt: CompareFormat = typer.Option(CompareFormat.table, "--format", help="How stdout shows the table."),
    chart: Optional[Path] = typer.Option(None, "--chart", metavar="PNG",
                                         help="Also draw bench tiers and accuracy per task (needs the plot extra)."),
    best_s1: Optional[float] = typer.Option(None, "--best-s1", metavar="SECONDS",
                                            help="Best S1 time (default: the fastest compared run's)."),
    best_s8: Optional[float] = typer.Option(None, "--best-s8", metavar="SECONDS", help="Best S8 time."),
    best_smax: Optional[float] = typer.Option(None, "--best-smax", metavar="SECONDS", help="Best Smax time."),
) -> None:
    """Runs side by side: accuracy, C, S1/S8/Smax, final. Exit 1 when a run is below the gate (C < 1).

    RESULTS are the JSON files of soarpack eval and bench, grouped into runs by their --label (else the served
    model). S = 100 x best / ours with best the fastest compared run's time (or --best-*).

    Example:

    \b
      soarpack compare eval-a.json bench-a.json eval-b.json bench-b.json \\
        --chart runs.png
    """
    from soarpack.bench.compare import load_runs, render, score_runs

    runs = load_runs(results)
    given = {t: v for t, v in (("s1", best_s1), ("s8", best_s8), ("smax", best_smax)) if v is not None}
    best = score_runs(runs, given)
    if chart is not None:
        from soarpack.bench.chart import write_chart

        _say(f"wrote {write_chart(runs, chart)}")
    typer.echo(render(runs, fmt.value, best))
    below = [r.name for r in runs if r.below_gate]
    if below:
        raise BelowGateError(f"below the accuracy gate (C < 1, or an incomplete eval): {', '.join(below)}",
                             "the platform multiplies such a run's speed score by C")
