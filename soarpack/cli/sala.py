"""CLI commands of soarpack.sala: the tiny-model factory and a forward pass through our implementation."""

from __future__ import annotations

import inspect

from soarpack.cli import command, request_values
from soarpack.cli.output import Output
from soarpack.commands.tiny import TinyModelRequest
from soarpack.request import typer_parameters


def tiny_model(**given) -> Output:
    """Write a tiny random MiniCPM-SALA checkpoint in the exact Hugging Face layout.

    Example:

    \b
      soarpack tiny-model tiny --pattern SLLS
    """
    from soarpack import api

    path = api.tiny_model(**request_values(TinyModelRequest, given))
    from soarpack.sala.config import load_config

    return Output({"path": str(path), "mixer_types": list(load_config(path).mixer_types)},
                  f"wrote tiny MiniCPM-SALA checkpoint to {path}")


tiny_model.__signature__ = inspect.Signature(typer_parameters(TinyModelRequest), return_annotation=Output)  # type: ignore
tiny_model = command("tiny-model")(tiny_model)
