"""`soarpack kernels`: time the W4 routes on this GPU for a checkpoint's (or the recipes') shapes; the dispatch
thresholds they imply."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from soarpack.cli import command
from soarpack.cli.output import Output


@command("kernels")
def kernels(
    ckpt: Optional[Path] = typer.Argument(None, metavar="CKPT", help="A quantized checkpoint (its config.json and quantize_config.json)."),
    recipe: Optional[List[str]] = typer.Option(None, "--recipe", metavar="NAME", help="A recipe name or .toml instead of a checkpoint (repeatable). Neither: every built-in recipe."),
    m: Optional[str] = typer.Option(None, "--m", metavar="M,...", help="Row counts to time (default 1,2,4,...,16384: every power of 2)."),
    marlin_ext: Optional[Path] = typer.Option(None, "--marlin-ext", metavar="SO", help="Marlin built by benchmarks/build_marlin_ext.py, when sgl_kernel does not import."),
    out: Optional[Path] = typer.Option(None, "-o", "--output", metavar="FILE", help="Also write the JSON result here."),
    old_out: Optional[Path] = typer.Option(None, "--out", hidden=True),
) -> Output:
    """Time the W4 and FP8 kernel routes on this GPU for CKPT's shapes (or the recipes'); print the thresholds.

    bf16, Marlin, dequantize + bf16 GEMM, the split-K W4 kernel, patch 04's dispatch and patch 05's FP8 route (the
    activations' quantization included), for the shapes and widths of CKPT (or of the recipes), against the read
    floor measured in the same run; sum them per recipe for a decode step and a prefill chunk; print the
    SOARPACK_W4_DISPATCH and SOARPACK_FP8_PREFILL thresholds they imply. Needs a CUDA GPU.

    Example:

    \b
      soarpack kernels ckpt-w4 --json > kernels.json
      soarpack kernels --recipe w4-mlp --recipe w4-full
    """
    from soarpack.cli import UsageError, renamed

    out = renamed(out, old_out, "--output", "--out")
    from soarpack.placement.write import atomic_write_json
    from soarpack.kernels.measure import M_DEFAULT, render_text, run_kernels

    try:
        ms = [int(v) for v in m.split(",")] if m else list(M_DEFAULT)
    except ValueError:
        raise UsageError(f"--m {m!r} is not a list of row counts", "write e.g. --m 1,8,32,8192") from None
    if any(v < 1 for v in ms):
        raise UsageError("--m takes row counts of 1 or more", "write e.g. --m 1,8,32,8192")
    res = run_kernels(ckpt, recipe or (), ms, marlin_ext=str(marlin_ext) if marlin_ext else None)
    if out:
        atomic_write_json(out, res)
    return Output(res, render_text(res))
