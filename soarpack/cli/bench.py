"""CLI commands of soarpack.bench: eval, bench, speedset, score. Logic lives in soarpack.bench."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from soarpack.cli import command
from soarpack.errors import SoarpackError


class IncompleteRunError(SoarpackError):
    """A measurement ran but some requests failed: its numbers are not the server's."""

    exit_code = 1


def _console():
    from rich.console import Console

    return Console(stderr=True)


@command("eval")
def eval_cmd(
    api_base: str = typer.Option(..., "--api-base", help="Server address, e.g. http://127.0.0.1:30000."),
    data: Path = typer.Option(..., "--data", help="JSONL with {task, question, gold} per line (perf_public_set.jsonl)."),
    model_path: Optional[Path] = typer.Option(None, "--model-path", help="Served model dir: stop strings come from its generation config and tokenizer, as on the platform."),
    concurrency: int = typer.Option(32, "--concurrency", min=1, help="Requests in flight at most."),
    num_samples: Optional[int] = typer.Option(None, "--num-samples", min=1, help="Only the first N rows."),
    timeout: float = typer.Option(3000.0, "--timeout", help="Per-request timeout in seconds (> 0); a timeout scores 0."),
    stall_timeout: float = typer.Option(60.0, "--stall-timeout", help="Fail a request whose reply has started but then sends no byte for this many seconds (default 60, well under --timeout; waiting for the reply to start is bounded by --timeout)."),
    retries: int = typer.Option(0, "--retries", help="Send a failed request again up to N times (default 0: the platform's eval_model.py does not retry, a failed row scores 0). The report gives the accuracy with and without retries."),
    max_tokens: int = typer.Option(65536, "--max-tokens", help="max_tokens per request, at least 1 (the platform sends 65536)."),
    output: Path = typer.Option(Path("eval.json"), "-o", "--output", help="Result JSON; an existing one is resumed (scored rows are not sent again) and its rows are kept."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    """Score a running server on the correctness set exactly as the platform's eval_model.py does.

    Exits 1 when any request failed (the run is incomplete; run it again to resend the failed rows)."""
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from soarpack.bench.evaluate import EvalConfig, check_eval_config, run_eval
    from soarpack.bench.render import print_eval

    console = _console()
    cfg = EvalConfig(api_base=api_base, data=data, output=output, model_dir=model_path, concurrency=concurrency,
                     num_samples=num_samples, timeout_s=timeout, max_tokens=max_tokens, stall_s=stall_timeout,
                     retries=retries)
    check_eval_config(cfg)
    if model_path is None:
        console.print("[yellow]no --model-path: requests carry no stop strings (the platform sends the model's eos tokens)[/]")
    with Progress(TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[note]}"), console=console, transient=True) as progress:
        bar = progress.add_task("eval", total=None, note="")
        scores = []

        def on_result(record: dict, done: int, total: int) -> None:
            scores.append(record["score"])
            note = f"mean {100 * sum(scores) / len(scores):.1f}" + (f"  [red]{escape(record['error'])}[/]" if record["error"] else "")
            progress.update(bar, completed=done, total=total, note=note)

        report = run_eval(cfg, on_result)
    print_eval(console, report)
    console.print(f"wrote {output}", markup=False, highlight=False)
    if as_json:
        typer.echo(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=2))
    if report["failed"]:
        raise IncompleteRunError(f"eval incomplete: {report['failed']} of {report['total']} requests failed "
                                 "(they score 0, as on the platform)",
                                 "fix the server and run the same command again: only the failed rows are sent")


@command("bench")
def bench_cmd(
    api_base: str = typer.Option(..., "--api-base", help="Server address, e.g. http://127.0.0.1:30000."),
    s1: Optional[Path] = typer.Option(None, "--s1", help="Speed JSONL for S1 (concurrency 1); tier skipped if absent."),
    s8: Optional[Path] = typer.Option(None, "--s8", help="Speed JSONL for S8 (concurrency 8)."),
    smax: Optional[Path] = typer.Option(None, "--smax", help="Speed JSONL for Smax (no concurrency cap)."),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="Tokenizer dir for max_new_tokens (default: the served model id, if it is a local dir)."),
    output: Path = typer.Option(Path("bench.json"), "-o", "--output", help="Result JSON (what `soarpack score` reads)."),
    seed: int = typer.Option(1, "--seed", help="Shuffle seed (the platform uses 1)."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", min=1, help="Only the first N rows after shuffling."),
    warmup: bool = typer.Option(True, "--warmup/--no-warmup", help="One warm-up request per tier, as the platform."),
    flush: bool = typer.Option(True, "--flush/--no-flush", help="POST /flush_cache before each tier, as the platform."),
    settle: float = typer.Option(1.0, "--settle", min=0.0, help="Seconds to wait after the flush before timing (bench_serving waits 1)."),
    stall_timeout: float = typer.Option(600.0, "--stall-timeout", help="Fail a request whose stream sends no byte for this many seconds (default 600; the whole request is bounded by bench_serving's 6 h)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout."),
) -> None:
    """Time S1, S8 and Smax against a running server with the platform's bench_serving semantics.

    The output is replaced only when every tier finished; until then tiers go to OUTPUT.partial.json. Exits 1 when
    a tier had failed requests or outputs shorter than asked (`soarpack score` refuses such a tier)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from soarpack.bench.render import print_bench
    from soarpack.bench.speed import BenchConfig, check_bench_config, partial_path, run_bench

    tiers = {name: path for name, path in (("s1", s1), ("s8", s8), ("smax", smax)) if path is not None}
    cfg = BenchConfig(api_base=api_base, tiers=tiers, tokenizer_dir=tokenizer, output=output, seed=seed,
                      num_prompts=num_prompts, warmup=warmup, flush_cache=flush, settle_s=settle, stall_s=stall_timeout)
    check_bench_config(cfg)
    console = _console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        bars = {}

        def on_event(tier: str, done: int, total: int) -> None:
            if tier not in bars:
                bars[tier] = progress.add_task(tier, total=total)
            progress.update(bars[tier], completed=done)

        try:
            report = run_bench(cfg, on_event)
        except KeyboardInterrupt:
            progress.stop()
            console.print(f"interrupted: {output} was left as it was; finished tiers are in {partial_path(output)}",
                          markup=False, highlight=False)
            raise typer.Exit(130) from None
    print_bench(console, report)
    console.print(f"wrote {output}", markup=False, highlight=False)
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    bad = {name: tier for name, tier in report["tiers"].items() if tier["failed"] or tier["short_outputs"]}
    if bad:
        raise IncompleteRunError("bench incomplete: " + "; ".join(
            f"{name} had {tier['failed']} failed and {tier['short_outputs']} short request(s)" for name, tier in bad.items()),
            "score refuses these tiers; check the server log (and that it honours ignore_eos)")


@command("speedset")
def speedset_cmd(
    tokenizer: Path = typer.Option(..., "--tokenizer", help="Tokenizer dir (the served model's) that counts the lengths."),
    n: int = typer.Option(..., "-n", "--rows", min=1, help="Number of rows."),
    output: Path = typer.Option(..., "-o", "--output", help="JSONL to write ({question, model_response} per line)."),
    mix: Optional[Path] = typer.Option(None, "--mix", help="Length mix, TOML or JSON: [[input]] and [[output]] buckets with min, max, share. Default: the published mix."),
    text: Optional[Path] = typer.Option(None, "--text", help="UTF-8 text to cut rows from (default: built-in prose)."),
    seed: int = typer.Option(1, "--seed", help="Seed for lengths and text."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file."),
) -> None:
    """Write a speed set that follows the published input/output length mix."""
    from soarpack.bench import speedset as ss
    from soarpack.bench.render import print_speedset
    from soarpack.bench.tokenizer import load_tokenizer
    from soarpack.errors import OutputExistsError
    from soarpack.fsutil import ensure_writable_output

    ensure_writable_output(output, what="speedset output")
    if output.exists() and not force:
        raise OutputExistsError(f"{output} exists", "pass --force to replace it")
    buckets = ss.load_mix(mix)
    rows, summary = ss.make_speedset(load_tokenizer(tokenizer), n, buckets, seed, ss.speedset_text(text))
    ss.write_jsonl(output, rows)
    hist = {"input": ss.bucket_histogram(summary.input_tokens, buckets["input"]),
            "output": ss.bucket_histogram(summary.output_tokens, buckets["output"])}
    console = _console()
    print_speedset(console, buckets, hist, summary)
    console.print(f"wrote {output}", markup=False, highlight=False)


@command("score")
def score_cmd(
    ours: Path = typer.Option(..., "--ours", help="Our bench JSON (soarpack bench -o)."),
    eval_json: Optional[Path] = typer.Option(None, "--eval", help="Our eval JSON; without it C = 1 is assumed."),
    best: Optional[Path] = typer.Option(None, "--best", help="A bench JSON holding the best durations."),
    best_s1: Optional[float] = typer.Option(None, "--best-s1", help="Best S1 duration in seconds (overrides --best)."),
    best_s8: Optional[float] = typer.Option(None, "--best-s8", help="Best S8 duration in seconds."),
    best_smax: Optional[float] = typer.Option(None, "--best-smax", help="Best Smax duration in seconds."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """The competition's final score: (0.4·S1 + 0.3·S8 + 0.3·Smax) × C with S = 100 × best / ours."""
    from soarpack.bench.competition import durations_from_bench, final_score, overall_from_eval
    from soarpack.bench.render import print_score

    best_durations = durations_from_bench(best) if best is not None else {}
    for tier, value in (("s1", best_s1), ("s8", best_s8), ("smax", best_smax)):
        if value is not None:
            best_durations[tier] = value
    overall = overall_from_eval(eval_json) if eval_json is not None else None
    result = final_score(durations_from_bench(ours), best_durations, overall)
    print_score(_console(), result)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
