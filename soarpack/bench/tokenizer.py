"""Tokenizer loading and the stop strings the platform derives from a model directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

from soarpack.errors import InputDataError


def load_tokenizer(path: str | Path):
    """A Hugging Face tokenizer from a local directory (tokenizer.json + tokenizer_config.json)."""
    path = Path(path)
    if not path.is_dir():
        raise InputDataError(f"tokenizer directory {path} does not exist", "pass the served model's directory")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=True)
    except (OSError, ValueError) as exc:
        raise InputDataError(f"no usable tokenizer in {path} ({exc.__class__.__name__}: {str(exc)[:200]})",
                             "the directory needs tokenizer.json or tokenizer.model plus tokenizer_config.json") from None


def count_tokens(tokenizer, text: str) -> int:
    """Token count with the tokenizer's default special tokens, as bench_serving counts."""
    return len(tokenizer.encode(text))


def stop_strings(model_dir: str | Path, tokenizer=None) -> List[str]:
    """eval_model.py's `stop`: each generation_config eos id decoded, plus the tokenizer's eos token, deduplicated."""
    model_dir = Path(model_dir)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_dir)
    words: List[str] = []
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        try:
            eos = json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id")
        except json.JSONDecodeError as exc:
            raise InputDataError(f"{gen_path} is not valid JSON ({exc.msg})", "restore the model's original file") from None
        ids = [eos] if isinstance(eos, int) else (eos or [])
        words += [tokenizer.decode(token_id) for token_id in ids]
    if tokenizer.eos_token:
        words.append(tokenizer.eos_token)
    # The platform passes list(set(...)); sorted keeps our requests reproducible with the same members.
    return sorted({word for word in words if word})
