"""Outside text (file names, bundle members, server replies and ids, server logs) made safe to print on a terminal.

A file name or a reply may hold an escape sequence (`ESC ] 0 ; title BEL`, `ESC [ 2 J`) that a terminal would
obey: retitle the window, clear the screen, rewrite an earlier line. `printable` writes every control character as
a visible escape instead (`\\x1b`, `\\r`, `\\u202e`), so what is printed is what the text holds.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls (0x9b is a one-byte CSI on some terminals), and the invisible characters that
# reorder or hide text (bidi overrides and isolates, zero-width marks, the BOM).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: "re.Match[str]") -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, keep: str = "") -> str:
    """`str(text)` with every control character escaped, except those in `keep` (e.g. "\\n" for a table)."""
    text = str(text)
    if keep:
        return _CONTROL.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)
    return _CONTROL.sub(_escape, text)
