"""CLI commands of soarpack.sala: the tiny-model factory and a forward pass through our implementation."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from soarpack.cli import command


@command("tiny-model")
def tiny_model(
    out: Path = typer.Argument(..., help="Directory to write the checkpoint to."),
    layers: int = typer.Option(4, "--layers", help="Number of decoder layers."),
    pattern: Optional[str] = typer.Option(
        None, "--pattern", help="Layer kinds as a string of S (sparse, minicpm4) and L (lightning), e.g. SLLS. Overrides --layers."
    ),
    hidden: int = typer.Option(256, "--hidden", help="hidden_size (a multiple of 128 keeps it Marlin-shaped)."),
    intermediate: int = typer.Option(640, "--intermediate", help="intermediate_size."),
    heads: int = typer.Option(2, "--heads", help="Attention heads of both layer kinds (head_dim 128)."),
    kv_heads: int = typer.Option(1, "--kv-heads", help="KV heads of the sparse layers."),
    vocab: int = typer.Option(512, "--vocab", help="Vocabulary size (tokenizer trained to it)."),
    seed: int = typer.Option(0, "--seed", help="Seed for weights and tokenizer."),
    force: bool = typer.Option(False, "--force", help="Replace a non-empty output directory."),
) -> None:
    """Write a tiny random MiniCPM-SALA checkpoint in the exact Hugging Face layout."""
    from soarpack.errors import ConfigError
    from soarpack.sala.config import LIGHTNING, SPARSE
    from soarpack.sala.tiny import make_tiny_model

    mixer_types: Optional[List[str]] = None
    if pattern:
        kinds = {"S": SPARSE, "L": LIGHTNING}
        bad = sorted(set(pattern.upper()) - set(kinds))
        if bad:
            raise ConfigError(f"--pattern may hold only S and L, got {''.join(bad)!r}")
        mixer_types = [kinds[c] for c in pattern.upper()]
    path = make_tiny_model(
        out,
        num_layers=layers,
        mixer_types=mixer_types,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        lightning_nh=heads,
        vocab_size=vocab,
        seed=seed,
        force=force,
    )
    typer.echo(f"wrote tiny MiniCPM-SALA checkpoint to {path}")
