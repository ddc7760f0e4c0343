"""CLI commands of soarpack.sala: the tiny-model factory and a forward pass through our implementation."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from soarpack.cli import command
from soarpack.cli.output import Output


@command("tiny-model")
def tiny_model(
    out: Path = typer.Argument(..., metavar="OUT", help="Directory to write the checkpoint to."),
    layers: int = typer.Option(4, "--layers", metavar="N", help="Number of decoder layers."),
    pattern: Optional[str] = typer.Option(
        None, "--pattern", metavar="SL...",
        help="Layer kinds as a string of S (sparse, minicpm4) and L (lightning), e.g. SLLS. Overrides --layers."
    ),
    hidden: int = typer.Option(256, "--hidden", metavar="N", help="hidden_size (a multiple of 128 keeps it Marlin-shaped)."),
    intermediate: int = typer.Option(640, "--intermediate", metavar="N", help="intermediate_size."),
    heads: int = typer.Option(2, "--heads", metavar="N", help="Attention heads of both layer kinds (head_dim 128)."),
    kv_heads: int = typer.Option(1, "--kv-heads", metavar="N", help="KV heads of the sparse layers."),
    vocab: int = typer.Option(512, "--vocab", metavar="N", help="Vocabulary size (tokenizer trained to it)."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Seed for weights and tokenizer."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output directory."),
) -> Output:
    """Write a tiny random MiniCPM-SALA checkpoint in the exact Hugging Face layout.

    Example:

    \b
      soarpack tiny-model tiny --pattern SLLS
    """
    from soarpack import api

    path = api.tiny_model(out, layers=layers, pattern=pattern, hidden=hidden, intermediate=intermediate, heads=heads,
                          kv_heads=kv_heads, vocab=vocab, seed=seed, force=force)
    from soarpack.sala.config import load_config

    return Output({"path": str(path), "mixer_types": list(load_config(path).mixer_types)},
                  f"wrote tiny MiniCPM-SALA checkpoint to {path}")
