"""Read a JSONL data file whole and check it before any request is sent: a bad line names its number.

Lines end at b"\\n" only (a U+2028 or U+0085 inside a string is text); the file is capped in size (soarpack.inputs),
so a device or an endless pipe is refused, and a pipe (`/dev/fd/N`) is read like a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List, Tuple

from soarpack.errors import InputDataError
from soarpack.inputs import MAX_DATA_BYTES, iter_lines


def read_jsonl(path: str | Path, required: Iterable[str] = ()) -> List[dict]:
    """Every non-blank line as a dict; raise InputDataError on the first line that is not a JSON object
    with the `required` keys."""
    return [row for _, row in read_jsonl_numbered(path, required)]


def read_jsonl_numbered(path: str | Path, required: Iterable[str] = ()) -> List[Tuple[int, dict]]:
    """As read_jsonl, with each row's 1-based line number (for messages about a row's content)."""
    path = Path(path)
    required = tuple(required)
    lines = iter_lines(path, "data file", MAX_DATA_BYTES)
    rows = []
    for lineno, line in lines:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputDataError(
                f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})",
                "fix or delete that line; nothing was sent",
            ) from None
        if not isinstance(row, dict):
            raise InputDataError(f"{path}:{lineno}: a JSON object was expected, got {type(row).__name__}", "one object per line")
        missing = [key for key in required if key not in row]
        if missing:
            raise InputDataError(
                f"{path}:{lineno}: missing key(s) {', '.join(missing)}",
                f"every line needs {', '.join(required)}",
            )
        rows.append((lineno, row))
    if not rows:
        raise InputDataError(f"{path} holds no rows", "pass a JSONL file with one JSON object per line")
    return rows
