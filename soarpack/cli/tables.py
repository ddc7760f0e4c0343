"""Rich tables for eval, bench, speedset and score reports (the library returns dicts; this only draws them)."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from soarpack.printable import printable


def eval_table(report: dict) -> Table:
    table = Table(title=f"eval: {report['scored']}/{report['total']} rows scored")
    for col in ("task", "rows", "score sum", "accuracy"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for task, bucket in report["per_task"].items():
        table.add_row(printable(task), str(bucket["count"]), f"{bucket['score_sum']:.2f}", f"{bucket['accuracy']:.2f}")
    return table


def print_eval(console: Console, report: dict) -> None:
    console.print(eval_table(report))
    console.print(f"ori_accuracy [bold]{report['ori_accuracy']:.2f}[/]   overall_accuracy [bold]{report['overall_accuracy']:.2f}[/]"
                  f"   C [bold]{report['c_factor']:g}[/]" + ("" if report["complete"] else "   [yellow](incomplete)[/]"))
    records = [r for r in report.get("rows", []) if r.get("index", 0) < report["total"]]
    if records:
        from soarpack.measure.scoring import gate_of_records

        console.print(f"gate: {gate_of_records(records).text()}", markup=False, highlight=False)
    if report.get("retried"):
        first = report["without_retries"]
        console.print(f"{report['retried']} row(s) needed a retry; without retries (as the platform runs): "
                      f"ori_accuracy {first['ori_accuracy']:.2f}   overall_accuracy {first['overall_accuracy']:.2f}   "
                      f"C {first['c_factor']:g}", highlight=False)
    for err in report["errors"][:20]:
        console.print(Text.assemble((f"row {err['index']} ({printable(err['task'])}) scored 0:", "red"), " ",
                                    printable(err["error"])), highlight=False)
    if len(report["errors"]) > 20:
        console.print(f"[red]... and {len(report['errors']) - 20} more errors (see the JSON)[/]")


def print_bench(console: Console, report: dict) -> None:
    table = Table(title=f"bench against {escape(printable(report['api_base']))}")
    for col in ("tier", "conc", "req", "fail", "short", "duration s", "TTFT ms p50/p99", "ITL ms p50/p99", "out tok/s"):
        table.add_column(col, justify="right")
    for name, tier in report["tiers"].items():
        ttft, itl = tier["ttft_ms"], tier["itl_ms"]
        table.add_row(name, str(tier["concurrency"] or "∞"), str(tier["num_requests"]), str(tier["failed"]),
                      str(tier.get("short_outputs", 0)),
                      f"{tier['duration_s']:.2f}", f"{ttft['median']:.0f}/{ttft['p99']:.0f}",
                      f"{itl['median']:.1f}/{itl['p99']:.1f}", f"{tier['output_throughput']:.0f}")
    console.print(table)


def print_speedset(console: Console, mix, histograms: dict, summary) -> None:
    for side in ("input", "output"):
        cap = mix.cap(side) if hasattr(mix, "cap") else None
        table = Table(title=f"{side} tokens" + (f" (cut to {cap})" if cap else ""))
        for col in ("bucket", "share", "rows"):
            table.add_column(col, justify="right")
        for bucket, rows in zip(mix[side], histograms[side]):
            table.add_row(f"({bucket.lo}, {bucket.hi}]", f"{bucket.share:.0%}", str(rows))
        console.print(table)
    console.print(f"{summary.rows} rows; largest length miss {summary.max_abs_error} token(s)")
    if hasattr(mix, "source"):
        console.print(f"mix {printable(mix.name)}: {printable(mix.source)}", markup=False, highlight=False)


def print_score(console: Console, result: dict, tiers: Sequence[str] = ("s1", "s8", "smax")) -> None:
    table = Table(title="competition score")
    for col in ("tier", "ours s", "best s", "S"):
        table.add_column(col, justify="right")
    for t in tiers:
        table.add_row(t, f"{result['ours_s'][t]:.2f}", f"{result['best_s'][t]:.2f}", f"{result['tier_scores'][t]:.2f}")
    console.print(table)
    acc = "not given, C = 1 assumed" if result["c_assumed"] else f"{result['overall_accuracy']:.2f}"
    console.print(f"speed score {result['speed_score']:.2f}   overall_accuracy {acc}   C {result['c_factor']:g}"
                  f"   final [bold]{result['final_score']:.2f}[/]")
    for note in result.get("notes", []):
        console.print(f"note: {note}", markup=False, highlight=False)
