"""CLI commands of soarpack.measure: eval, bench, speedset, score, compare. Logic lives in soarpack.measure.

Each command returns its Output: tables on stdout (`> score.txt` keeps them), or the JSON with --format json; progress,
notes and errors go to stderr. A no-go result (below the gate, an incomplete run) is a Verdict: exit 1.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import typer

from soarpack.cli import command, err_console, renamed, request_values, required
from soarpack.commands.measure import TRUST_HELP as _TRUST_HELP, BenchRequest, CompareRequest, EvalRequest, ScoreRequest
from soarpack.cli.output import NORMAL, STATE, Output, Verdict, sink
from soarpack.errors import SoarpackError
from soarpack.facts import limits, scoring as platform_scoring
from soarpack.printable import printable
from soarpack.request import typer_parameters


def _note(event) -> None:
    """An eval's or bench's line: the --bundle it measures is always named, other notes unless -q; with --format
    json neither (the document records the bundle)."""
    if sink().json:
        return
    if event.phase == "bundle":
        err_console.print(event.message, markup=False, highlight=False)
    else:
        _say(event.message)


PLAIN_PROGRESS_EVERY_S = 30.0


class IncompleteRunError(Verdict):
    """A measurement ran but some requests failed: its numbers are not the server's."""


class BelowGateError(Verdict):
    """A run fails the accuracy gate (C < 1: less than full credit) or its eval is incomplete: a no-go."""


def _say(message: str) -> None:
    """A note on stderr, unless -q or --format json."""
    sink().say(message)


@contextmanager
def progress_bars(label: str) -> Iterator[Callable[[str, int, Optional[int], str], None]]:
    """update(name, done, total, note): a live bar on a terminal; else a plain line every 30 s (a log, CI); with -q
    nothing."""
    if STATE.verbosity < NORMAL:
        yield lambda name, done, total, note="": None
        return
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
            err_console.print(printable(f"{label} {name}: {done}/{total} after {now - start:.0f} s"  # progress: also
                                        + (f"  {note}" if note else "")),  # under --format json
                              markup=False, highlight=False, soft_wrap=True)

    yield update


def eval_cmd(**given) -> Output:
    """Score a running server on the correctness set as the platform's eval_model.py does.

    Exits 1 when any request failed (the run is incomplete; run it again to resend the failed rows).

    Example:

    \b
      soarpack eval --api-base http://127.0.0.1:30000 \\
        --data perf_public_set.jsonl --model-dir Q -o eval.json
    """
    from rich.markup import escape

    from soarpack import api
    from soarpack.measure.compare import eval_gate
    from soarpack.cli.tables import print_eval

    values = request_values(EvalRequest, given)
    EvalRequest.from_cli(values)  # a wrong value is refused by its flag (the bounds: the library's, in api.eval)
    scores = []
    with progress_bars("eval") as update:
        def on_event(event) -> None:
            if event.kind != "progress":
                return _note(event)
            record = event.data
            scores.append(record["score"])
            note = f"mean {100 * sum(scores) / len(scores):.1f}" + (f"  {escape(printable(record['error']))}" if record["error"] else "")
            update("rows", event.done, event.total, note)

        report = api.eval(**values, on_event=on_event).to_dict()
    _say(f"wrote {values['output']}")
    data = {**{k: v for k, v in report.items() if k != "rows"}, "gate": eval_gate(report).to_dict()}
    return Output(data, lambda console: print_eval(console, report), _eval_verdict(report))


eval_cmd.__signature__ = inspect.Signature(typer_parameters(EvalRequest), return_annotation=Output)  # type: ignore
eval_cmd = command("eval")(eval_cmd)


def _eval_verdict(report: dict) -> Optional[Verdict]:
    if report["failed"]:
        return IncompleteRunError(f"eval incomplete: {report['failed']} of {report['total']} requests failed "
                                 "(they score 0, as on the platform)",
                                 "fix the server and run the same command again: only the failed rows are sent")
    if report["c_factor"] < 1:
        return BelowGateError(f"below the accuracy gate: ori {report['ori_accuracy']:.2f} (overall "
                             f"{report['overall_accuracy']:.2f}) gives C = {report['c_factor']}; full credit needs "
                             f"ori > {platform_scoring.FULL_CREDIT_ORI:g}", "this checkpoint would lose score on the platform: try a safer recipe")
    return None


def bench_cmd(**given) -> Output:
    """Time S1, S8 and Smax against a running server with the platform's bench_serving semantics.

    The output is replaced only when every tier finished; until then tiers go to OUTPUT.partial.json. Exits 1 when
    a tier had failed requests or outputs shorter than asked (score refuses such a tier).

    Example:

    \b
      soarpack bench --api-base http://127.0.0.1:30000 --model-dir Q \\
        --s1 s1.jsonl --s8 s8.jsonl --smax smax.jsonl
    """
    from soarpack import api
    from soarpack.measure.speed import partial_path
    from soarpack.cli.tables import print_bench

    values = request_values(BenchRequest, given)
    BenchRequest.from_cli(values)  # a wrong value is refused by its flag (the bounds: the library's, in api.bench)
    output = values["output"]
    partial_before = _file_identity(partial_path(output))
    with progress_bars("bench") as update:
        def on_event(event) -> None:
            if event.kind != "progress":
                return _note(event)
            update(event.phase, event.done, event.total, "")

        try:
            report = api.bench(**values, on_event=on_event).to_dict()
        except KeyboardInterrupt:
            # shown even with -q, as an error is: the user must know what is (and is not) on disk
            err_console.print(f"interrupted: {printable(output)} was left as it was; "
                              f"{_partial_note(partial_path(output), partial_before)}",
                              markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(130) from None
    _say(f"wrote {output}")
    return Output(report, lambda console: print_bench(console, report), _bench_verdict(report))


bench_cmd.__signature__ = inspect.Signature(typer_parameters(BenchRequest), return_annotation=Output)  # type: ignore
bench_cmd = command("bench")(bench_cmd)


def _bench_verdict(report: dict) -> Optional[Verdict]:
    bad = {name: tier for name, tier in report["tiers"].items()
           if tier["failed"] or tier["short_outputs"] or tier.get("long_outputs")}
    if bad:
        return IncompleteRunError("bench incomplete: " + "; ".join(
            f"{name} had {tier['failed']} failed, {tier['short_outputs']} short and {tier.get('long_outputs', 0)} "
            "over-long request(s)" for name, tier in bad.items()),
            "score refuses these tiers; check the server log (and that it honours ignore_eos and max_new_tokens)")
    return None


def _file_identity(path: Path) -> Optional[tuple]:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _partial_note(partial: Path, before: Optional[tuple]) -> str:
    """What an interrupted bench left in OUTPUT.partial.json: this run's finished tiers, or nothing of this run."""
    now = _file_identity(partial)
    if now is None:
        return f"no tier had finished, so no partial results were written ({printable(partial)} does not exist)"
    if now == before:
        return f"no tier had finished; {printable(partial)} is an earlier run's, left as it was"
    try:
        tiers = json.loads(partial.read_text(encoding="utf-8"))["tiers"]
        rows = ", ".join(f"{name} {tier['num_requests']} rows" for name, tier in tiers.items())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"this run wrote {printable(partial)}, which cannot be read back ({exc})"
    return f"the finished tiers are in {printable(partial)}: {len(tiers)} tier(s), {rows}"


@command("speedset")
def speedset_cmd(
    model_dir: Optional[Path] = typer.Option(None, "--model-dir", metavar="DIR",
                                             help="The served model's dir, whose tokenizer counts the lengths. "
                                                  "[required]"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=_TRUST_HELP),
    rows: int = typer.Option(..., "-n", "--rows", metavar="N", min=1, help="Number of rows."),
    output: Path = typer.Option(..., "-o", "--output", metavar="FILE",
                                help="JSONL to write ({question, model_response} per line)."),
    mix: Optional[str] = typer.Option(None, "--mix", metavar="PRESET|FILE",
                                      help="Length mix: a preset (published, long-128k, 1of16: `soarpack speedset "
                                           "--help` says where each one's shares come from) or a TOML/JSON file of "
                                           "[[input]] and [[output]] buckets with min, max, share and optional "
                                           "input_cap/output_cap. Default: published."),
    text: Optional[Path] = typer.Option(None, "--text", metavar="FILE",
                                        help="UTF-8 text to cut rows from (default: built-in prose)."),
    seed: int = typer.Option(1, "--seed", metavar="N", help="Seed for lengths and text."),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file."),
    old_tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", hidden=True),
) -> Output:
    """Write a speed set that follows a length mix (default: the published input/output mix).

    Presets: published (the competition's published mix; the platform now runs a longer hidden set, 68% of its inputs
    in 32K-512K tokens), long-128k (the published shares with inputs cut to 128K tokens and outputs to 256: the
    platform's prompt lengths on one H200 lease), 1of16 (every bound divided by 16: inputs to 10K, outputs to 2K).

    Example:

    \b
      soarpack speedset --model-dir Q -n 16 --mix long-128k -o speed-long.jsonl
    """
    from soarpack.measure import speedset as ss
    from soarpack.measure.tokenizer import load_tokenizer
    from soarpack.cli.tables import print_speedset
    from soarpack.placement.checks import ensure_writable_output
    from soarpack.placement.write import place_bytes

    model_dir = required(renamed(model_dir, old_tokenizer, "--model-dir", "--tokenizer"), "--model-dir")
    buckets = ss.load_mix(mix)
    mix_file = Path(mix) if mix is not None and mix not in ss.PRESETS else None
    inputs = [p for p in (model_dir, mix_file, text) if p is not None]
    ensure_writable_output(output, what="speedset output", inputs=inputs)
    table_rows, summary = ss.make_speedset(load_tokenizer(model_dir, trust_remote_code=trust_remote_code), rows, buckets, seed, ss.speedset_text(text))
    # An existing file with other rows needs --force, the same rows are up to date: decided when it is placed.
    placed = place_bytes(output, ss.jsonl_text(table_rows).encode("utf-8"), force=force, inputs=inputs,
                         what="speedset output", log=sink().note)
    hist = {"input": ss.bucket_histogram(summary.input_tokens, buckets["input"]),
            "output": ss.bucket_histogram(summary.output_tokens, buckets["output"])}
    _say(placed.says())
    data = {"output": str(output), "rows": summary.rows, "max_abs_error": summary.max_abs_error, "histogram": hist,
            "mix": buckets.describe(), "sha256": hashlib.sha256(output.read_bytes()).hexdigest()}
    return Output(data, lambda console: print_speedset(console, buckets, hist, summary))


def score_cmd(**given) -> Output:
    """The competition's final score: (0.4 S1 + 0.3 S8 + 0.3 Smax) x C, with S = 100 x best / ours.

    A tier's best time is the shortest benchmark duration any team has on the competition's leaderboard; soarpack
    knows no current value, so pass each one (--best-s1, --best-s8, --best-smax) or a bench JSON (--best).

    Example:

    \b
      soarpack score --ours bench.json --eval eval.json \\
        --best-s1 SECONDS --best-s8 SECONDS --best-smax SECONDS
    """
    from soarpack import api
    from soarpack.cli.tables import print_score

    values = request_values(ScoreRequest, given)
    ScoreRequest.from_cli(values)
    result = api.score(**values).to_dict()
    verdict = None
    if result["c_factor"] < 1:
        verdict = BelowGateError(f"C = {result['c_factor']} (overall accuracy {result['overall_accuracy']}): final "
                             f"{result['final_score']:.2f} is below full credit", f"C = 1 needs ori accuracy > {platform_scoring.FULL_CREDIT_ORI:g}")
    return Output(result, lambda console: print_score(console, result), verdict)


score_cmd.__signature__ = inspect.Signature(typer_parameters(ScoreRequest), return_annotation=Output)  # type: ignore
score_cmd = command("score")(score_cmd)


class TableStyle(str, enum.Enum):
    md = "md"
    csv = "csv"


class _OldCompareFormat(str, enum.Enum):  # `compare --format md|csv|json|table`, before --table and the global --format
    table = "table"
    md = "md"
    csv = "csv"
    json = "json"


def compare_cmd(**given) -> Output:
    """Runs side by side: ori, margin, interval, C, S1/S8/Smax, final. Exit 1 if a run is below the gate.

    ori is the eval's ori_accuracy, margin its distance to the full-credit line (C = 1 above it), ci95 a 95% interval
    stratified by task. gate: below (ori at or below the line, C < 1, or an incomplete eval: exit 1), at risk (the
    interval reaches the line: exit 0, but one rerun may land below), or pass.

    RESULTS are the JSON files of soarpack eval and bench, grouped into runs by their --label (else the served
    model). S = 100 x best / ours with best the fastest compared run's time (or --best-*).

    Example:

    \b
      soarpack compare eval-a.json bench-a.json eval-b.json bench-b.json \\
        --chart runs.png
    """
    from soarpack import api

    table, old_fmt = given.pop("table"), given.pop("old_fmt")
    values = request_values(CompareRequest, given)
    CompareRequest.from_cli(values)
    if old_fmt is not None:
        err_console.print(f"note: compare --format {old_fmt.value} is now "
                          + ("--json" if old_fmt.value == "json" else f"--table {old_fmt.value}"
                             if old_fmt.value != "table" else "the default")
                          + "; the old spelling goes in the next release", markup=False, highlight=False)
        if old_fmt.value == "json":
            STATE.format = "json"
        table = table or (TableStyle(old_fmt.value) if old_fmt.value in ("md", "csv") else None)
    compared = api.compare(**values, on_event=lambda event: _say(event.message))
    runs = compared.runs
    for run in runs:
        if run.at_risk:
            _say(f"at risk: {run.name}: {run.gate.text()}")
    below = [r.name for r in runs if r.below_gate]
    verdict = BelowGateError(f"below the accuracy gate (C < 1, or an incomplete eval): {', '.join(below)}",
                             "the platform multiplies such a run's speed score by C") if below else None
    return Output(json.loads(compared.render("json")), compared.render(table.value if table else "table"), verdict)


# RESULTS and the numbers are CompareRequest's; the table's style is the command's own
compare_cmd.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    *typer_parameters(CompareRequest),
    inspect.Parameter("table", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[TableStyle], default=typer.Option(
        None, "--table", metavar="md|csv", help="The table as Markdown or CSV instead of aligned text.")),
    inspect.Parameter("old_fmt", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[_OldCompareFormat],
                      default=typer.Option(None, "--format", hidden=True)),
], return_annotation=Output)
compare_cmd = command("compare")(compare_cmd)
