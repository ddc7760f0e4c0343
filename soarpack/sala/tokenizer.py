"""Loading a SALA checkpoint's tokenizer without running its remote code."""

from __future__ import annotations

import warnings
from pathlib import Path

from soarpack.errors import CheckpointError


def load_tokenizer(path: str | Path):
    """The checkpoint's tokenizer (tokenizer.json + tokenizer_config.json, chat template included).

    `trust_remote_code=False`: the tokenizer is plain `tokenizers` data; the remote code is only the model's.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = Path(path)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise CheckpointError(f"no tokenizer.json in {path}", "pass a model directory that holds the tokenizer files")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot load the tokenizer in {path}: {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
