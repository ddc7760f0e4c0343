"""CLI commands of soarpack.quant: `quantize`, `verify`, `calib`, `recipes`. Logic lives in soarpack.quant."""

from __future__ import annotations

import inspect
from enum import Enum
from pathlib import Path
from typing import List, Optional, get_args

import typer

from soarpack.cli import command, renamed, required
from soarpack.cli.output import Output, sink
from soarpack.errors import CheckpointError, ConfigError
from soarpack.printable import printable

from soarpack.quant.options import CALIBRATION_DEFAULTS as _CAL
from soarpack.commands.quantize import QuantizeRequest
from soarpack.request import cli_values, typer_parameters


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def quantize_cmd(**given) -> Output:
    """GPTQ-quantize MODEL_DIR with a recipe into OUT, ready for SGLang's gptq_marlin.

    The report is written to OUT/soarpack_quant_report.json. It and the
    terminal say how many calibration rows were used of the rows asked for.

    The quality measures it prints, on the held-out rows (none of them is an
    accuracy; what soarpack measured is in benchmarks/RESULTS.md):

    \b
      sanity loss    the original model's next-token loss in nats; the run
                     stops above --max-sanity-loss. A random model sits near
                     ln(vocab) = 11.2. Unknown on the real model.
      KL mean / max  KL(original || quantized) per token, mean and worst.
                     Measured: 7.4e-4 / 2.3e-3 (w4-full, random weights,
                     32 layers; RESULTS.md 2). Unknown on the real model.
      top-1          share of tokens where both models rank the same next
      agreement      token first: 0.26-0.45 on random weights, where it
                     means little. Unknown on the real model.
      rel. error     per module, norm(dequantized W - W) / norm(W); verify
                     refuses above 0.3 at 4 bits, 0.03 at 8 bits. Not in
                     RESULTS.md; unknown on the real model.
      GPTQ loss      GPTQModel's per-module loss; peers found it does not
                     predict task sensitivity (docs/evidence.md). Unknown
                     on the real model.

    Example: soarpack quantize MiniCPM-SALA sala-w4 --recipe w4-mlp
    """
    from soarpack import api
    from soarpack.cli.progress import QuantizeProgress
    # torch before the bar: the bar wraps sys.stderr, and torch's log handlers keep the stream they find at import,
    # so imported under the bar its warnings would reach the terminal instead of the run's log.
    import soarpack.quant.run  # noqa: F401

    out = sink(quiet=given.pop("quiet"), verbose=given.pop("verbose"))
    values = cli_values(QuantizeRequest, given)
    request = QuantizeRequest.from_cli(values)  # the one validator; a refusal names the flag
    log = request.log or default_log_path(request.out_dir)
    # off a terminal: plain lines; on an error: the log's path; on Ctrl-C: where it stopped, and exit 130
    with QuantizeProgress(verbosity=out.verbosity, out_dir=request.out_dir, log=log) as progress:
        result = api.quantize(**{**values, "log": log}, library_output="terminal" if out.verbosity >= 2 else "log",
                              on_event=progress.render)
    return Output(result.to_dict(), lambda console: _draw_result(console, result, request.out_dir, log))


# the options are QuantizeRequest's fields; -q and -v are this command's own (over the global ones)
quantize_cmd.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    *typer_parameters(QuantizeRequest),
    inspect.Parameter("quiet", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--quiet", "-q", help="No progress bar; only fallbacks, problems and the result.")),
    inspect.Parameter("verbose", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--verbose", "-v", help="Every phase and step as a line; the libraries' own output on stderr too.")),
], return_annotation=Output)
quantize_cmd = command("quantize")(quantize_cmd)


def default_log_path(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + ".log") if out_dir.name not in ("", "..") else Path(str(out_dir.resolve()) + ".log")


def _draw_result(console, result, out_dir: Path, log: Path) -> None:
    from rich.table import Table

    from soarpack.quant.run import REPORT_FILE

    def echo(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    bits = sorted({b for b in result.modules.values() if not b.startswith("16")})
    table = Table(title=f"{result.recipe}: {result.quantized_modules} quantized ({', '.join(bits) or 'none'}), "
                        f"{result.skipped_modules} kept 16-bit")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    for k, v in result.timings.items():
        table.add_row(k, f"{v:.1f}")
    table.add_section()
    table.add_row("total", f"{sum(result.timings.values()):.1f}")
    console.print(table)
    kl = result.quality.get("kl")
    if kl:
        quality = Table(title="quality on the held-out rows")
        quality.add_column("measure")
        quality.add_column("value", justify="right")
        quality.add_row("sanity loss (nats)", f"{result.sanity_loss:.3f}")
        quality.add_row("KL mean / max", f"{kl['kl_mean']:.4g} / {kl['kl_max']:.4g}")
        quality.add_row("top-1 agreement", f"{kl['top1_agreement']:.3f}")
        console.print(quality)
    errors = result.quality.get("dequant_error") or {}
    losses = {f"model.layers.{r['layer']}.{r['module']}": r["loss"] for r in result.quality.get("gptq", [])}
    if errors:
        worst = Table(title="modules with the largest dequantization error")
        for col in ("module", "rel. error", "GPTQ loss"):
            worst.add_column(col, justify="left" if col == "module" else "right")
        for name, err in sorted(errors.items(), key=lambda kv: -kv[1])[:10]:
            loss = losses.get(name)
            worst.add_row(name, f"{err:.4f}", "" if loss is None else f"{loss:.3g}")
        console.print(worst)
    cal = result.calibration
    if "rows_used" in cal:
        from soarpack.quant.calibinfo import rows_line, where_from

        echo(printable(rows_line(cal["rows_used"], cal["rows_asked"], cal["asked_by"],
                                 where_from(cal["sources"], cal["builtin"]))))  # names the user's files
    for note in result.notes:
        echo(f"note: {printable(note)}")
    echo(f"report: {printable(out_dir / REPORT_FILE)}")
    n = result.library_warnings  # the libraries' warnings are in the log, not here; None: they went to the terminal
    echo(f"log: {printable(log)}" if n is None else f"{n} library warning{'s' if n != 1 else ''}: {printable(log)}")


@command("verify")
def verify_cmd(
    ckpt: Path = typer.Argument(..., metavar="CKPT", help="A quantized checkpoint directory."),
    original: Optional[Path] = typer.Option(None, "--original", metavar="DIR",
                                            help="The original checkpoint, for byte and error checks."),
    device: Device = typer.Option(Device.auto, "--device",
                                  help="Where to unpack and dequantize: a GPU when there is one (auto), cpu or cuda."),
) -> Output:
    """Check that CKPT is a GPTQ checkpoint gptq_marlin serves as is; exit non-zero listing every problem.

    Example: soarpack verify sala-w4 --original MiniCPM-SALA
    """
    from soarpack.quant.run import resolve_device
    from soarpack.quant.verify import verify_report

    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt} is not a directory", "pass a quantized checkpoint directory")
    rep = verify_report(ckpt, original, device=resolve_device(device.value))
    lines = [printable(p) for p in rep.problems]  # problems quote tensor names from the checkpoint
    if rep.module_errors:
        worst = max(rep.module_errors.items(), key=lambda kv: kv[1])
        lines.append(f"dequantization error: {len(rep.module_errors)} modules, worst {printable(worst[0])} {worst[1]:.4f}")
    lines.append("ok" if not rep.problems else f"{len(rep.problems)} problem(s)")
    return Output(rep.to_dict(), "\n".join(lines), exit_code=1 if rep.problems else 0)


@command("calib")
def calib_cmd(
    files: Optional[List[Path]] = typer.Argument(None, metavar="FILES", show_default=False,
                                                 help="JSONL or plain-text calibration files (formats above); none: the "
                                                      "built-in prompts."),
    model_dir: Optional[Path] = typer.Option(None, "--model-dir", metavar="DIR",
                                             help="Model directory whose tokenizer and chat template to use. "
                                                  "[required]"),
    rows: int = typer.Option(_CAL.rows, "-n", "--rows", metavar="N", help="Rows to select."),
    max_len: int = typer.Option(_CAL.max_len, "--max-len", metavar="TOKENS",
                                help="Tokens per row, left-truncated; below the model's dense_len."),
    seed: int = typer.Option(_CAL.seed, "--seed", metavar="N", help="Seed for selection and generation."),
    write_builtin: Optional[Path] = typer.Option(None, "--write-builtin", metavar="FILE",
                                                 help="Also write the built-in prompts as JSONL here."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --write-builtin file with other content."),
    old_tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", hidden=True),
) -> Output:
    """Preview calibration data: rows per task, token-length histogram, truncation.

    A JSONL line of FILES is one of:

    \b
      {"task": "mcq", "question": "...", "gold": "B"}  (the SOAR eval format)
      {"text": "..."}                                    (plain text)
      {"messages": [{"role": "user", "content": "..."}]} (chat, rendered
                                                          with the model's
                                                          chat template)

    Any other file (.txt, .md) is one row: its whole text.

    Example: soarpack calib mine.jsonl --model-dir MiniCPM-SALA -n 256
    """
    from soarpack.placement.checks import ensure_writable_output
    from soarpack.placement.write import place_bytes
    from soarpack.quant.calib import build_calibration, builtin_calibration_text, summarize

    tokenizer = required(renamed(model_dir, old_tokenizer, "--model-dir", "--tokenizer"), "--model-dir")
    inputs = [*(files or []), tokenizer]
    if write_builtin:
        ensure_writable_output(write_builtin, what="--write-builtin", inputs=inputs)
    dense_len = vocab_size = None
    if (tokenizer / "config.json").is_file():
        from soarpack.sala.config import load_config

        try:
            config = load_config(tokenizer)
            dense_len, vocab_size = config.dense_len, config.vocab_size
        except Exception:
            dense_len = None
    from soarpack.sala.tokenizer import check_vocab_fits, load_tokenizer

    loaded = load_tokenizer(tokenizer)
    if vocab_size is not None:
        check_vocab_fits(loaded, vocab_size, tokenizer)
    data = build_calibration(files or None, loaded, rows=rows, max_len=max_len, seed=seed, dense_len=dense_len)
    summary = summarize(data, max_len)
    from soarpack.quant.calibinfo import rows_line, shortfall, sources_of, where_from

    asked_by = "default" if rows == _CAL.rows else "-n"
    summary.update(rows_asked=rows, asked_by=asked_by, builtin=not files, sources=sources_of(files or []))
    where = where_from(summary["sources"], summary["builtin"])
    if write_builtin:
        placed = place_bytes(write_builtin, builtin_calibration_text(rows, seed, max_len).encode("utf-8"),
                             force=force, inputs=inputs, what="--write-builtin", log=sink().note)
        sink().say(placed.says())
    # file names and task names are the user's data: printable
    lines = [printable(f"{rows_line(summary['rows'], rows, asked_by, where)}; {summary['tokens']} tokens (min "
                         f"{summary['min_len']}, median {summary['median_len']}, max {summary['max_len']}), "
                         f"{summary['truncated']} left-truncated")]
    short = shortfall(summary["rows"], rows, asked_by, where)
    if short:
        lines.append(f"note: {printable(short)}")
    lines.append("tasks: " + ", ".join(f"{printable(k)} {v}" for k, v in summary["tasks"].items()))
    largest = max(summary["length_histogram"].values(), default=0)
    for bucket, n in summary["length_histogram"].items():
        lines.append(f"  {bucket:>11} {n:5d} {histogram_bar(n, largest)}".rstrip())
    return Output(summary, "\n".join(lines))


HISTOGRAM_WIDTH = 60


def histogram_bar(count: int, largest: int, width: int = HISTOGRAM_WIDTH) -> str:
    """`#` bars scaled to the largest bucket: different counts draw different lengths, any row at least one `#`."""
    if count <= 0 or largest <= 0:
        return ""
    return "#" * max(1, round(width * count / largest))


@command("recipes")
def recipes_cmd(
    name: Optional[str] = typer.Argument(None, metavar="NAME", help="Print this built-in recipe's TOML.",
                                         show_default=False),
) -> Output:
    """The built-in quantization recipes and what is known about each, with its source.

    Without NAME: every recipe, its description and its evidence (what peers measured on the platform, what
    soarpack measured, or that nothing was). With NAME: that recipe's TOML, to copy and edit.

    Example:

    \b
      soarpack recipes
      soarpack recipes w4-mlp > mine.toml
    """
    from soarpack.recipe.model import list_recipes, load_recipe
    from soarpack.recipe.files import RECIPES_DIR

    if name is not None:
        recipe = load_recipe(name)  # a name that is not a built-in stops here with the list
        if recipe.source != f"{name}.toml" or not (RECIPES_DIR / f"{name}.toml").is_file():
            raise ConfigError(f"{name!r} is not a built-in recipe name", f"built-in recipes: {', '.join(list_recipes())}")
        toml = (RECIPES_DIR / f"{name}.toml").read_text(encoding="utf-8")
        return Output({"name": name, "toml": toml}, lambda console: typer.echo(toml, nl=False))  # bytes as shipped
    recipes = [load_recipe(n) for n in list_recipes()]
    lines = []
    for r in recipes:
        lines += [f"{r.name}: {r.description}", *(f"    {e.line()}" for e in r.evidence)]
        if not r.evidence:
            lines.append("    no evidence recorded")
    return Output([{"name": r.name, "description": r.description, "evidence": [e.model_dump() for e in r.evidence]}
                   for r in recipes], "\n".join(lines))
