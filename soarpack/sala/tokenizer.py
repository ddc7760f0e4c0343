"""Loading a checkpoint's tokenizer the way the server does (`AutoTokenizer`), with one clear error."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from soarpack.errors import InputDataError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer of a model directory (tokenizer.json or tokenizer.model + tokenizer_config.json).

    `trust_remote_code=False` by default: the tokenizer is plain data, and the remote code is only the model's
    (tiny test models carry placeholders that refuse to import). The speed bench passes True, as SGLang's
    bench_serving does, so token counts are the platform's.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = Path(path)
    if not path.is_dir():
        raise InputDataError(f"tokenizer directory {path} does not exist", "pass the model directory")
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise InputDataError(f"no tokenizer.json or tokenizer.model in {path}",
                             "pass the model directory that ships its tokenizer")
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many kinds here (OSError, ValueError, ImportError ...)
        raise InputDataError(f"cannot load the tokenizer in {path}: {exc.__class__.__name__}: {str(exc)[:200]}",
                             "the directory needs tokenizer.json or tokenizer.model plus tokenizer_config.json") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def check_vocab_fits(tokenizer, vocab_size: int, where: str | Path) -> None:
    """Refuse a tokenizer whose ids reach past the checkpoint's embedding (config.json's vocab_size): GPTQModel
    would replace those ids with 0 and say so only in its log, calibrating on other text than the user's."""
    size = len(tokenizer)
    if size > vocab_size:
        raise InputDataError(f"the tokenizer in {where} has {size:,} tokens, more than config.json's vocab_size "
                             f"{vocab_size:,}: ids from {vocab_size:,} on have no embedding row",
                             "use the tokenizer that belongs to this checkpoint (or fix vocab_size in config.json)")
