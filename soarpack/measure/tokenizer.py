"""Tokenizer loading and the stop strings the platform derives from a model directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import List, Optional

from soarpack.errors import InputDataError


def load_tokenizer(path: str | Path, *, trust_remote_code: bool = False):
    """The tokenizer of a model folder the user named (never one a server named: its id is only a string).

    Its own code (`tokenization_*.py` behind an `auto_map`) runs only with `trust_remote_code`, the user's explicit
    the user's trust-remote-code flag, as SGLang's bench_serving loads it; when that code cannot be imported here, the same
    tokenizer files are loaded without it. Without the flag the files are read as data (tokenizer.json or
    tokenizer.model, tokenizer_config.json)."""
    from soarpack.sala.tokenizer import load_tokenizer as load_from_dir

    if trust_remote_code:
        try:
            return load_from_dir(path, trust_remote_code=True)
        except InputDataError:
            pass
    return load_from_dir(path, trust_remote_code=False)


def count_tokens(tokenizer, text: str) -> int:
    """Token count with the tokenizer's default special tokens, as bench_serving counts."""
    return len(tokenizer.encode(text))


def stop_strings(model_dir: str | Path, tokenizer=None, *, trust_remote_code: bool = False) -> List[str]:
    """eval_model.py's `stop`: each generation_config eos id decoded, plus the tokenizer's eos token, deduplicated."""
    model_dir = Path(model_dir)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_dir, trust_remote_code=trust_remote_code)
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


def chat_template_digest(model_dir: str | Path) -> Optional[str]:
    """A short digest of the chat template(s) a model directory declares (chat_template.jinja/.json, else
    tokenizer_config.json's `chat_template`), as the server applies them; None when it declares none."""
    model_dir = Path(model_dir)
    parts: List[str] = []
    for name in ("chat_template.jinja", "chat_template.json"):
        path = model_dir / name
        if path.is_file():
            parts.append(f"{name}\n{path.read_bytes().decode('utf-8', 'replace')}")
    config_path = model_dir / "tokenizer_config.json"
    if not parts and config_path.is_file():
        try:
            template = json.loads(config_path.read_bytes().decode("utf-8")).get("chat_template")
        except (ValueError, UnicodeDecodeError, AttributeError) as exc:
            raise InputDataError(f"{config_path} is not a JSON object ({exc})", "restore the model's original file") from None
        if template:
            parts.append(json.dumps(template, sort_keys=True))
    return hashlib.sha1("\n".join(parts).encode("utf-8")).hexdigest()[:16] if parts else None
