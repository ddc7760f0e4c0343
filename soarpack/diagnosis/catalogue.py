"""The catalogue of known failures (catalogue.toml beside this file): read, checked, typed.

Data only: which text names a failure, its cause and fix, and where that text comes from. A malformed catalogue is
a bug of soarpack, so it raises ValueError naming the entry rather than a user-facing error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Pattern, Tuple

from soarpack import _toml

CATALOGUE_PATH = Path(__file__).with_name("catalogue.toml")
SEVERITIES = ("error", "warning")
SOURCE_KINDS = ("log", "fork", "package", "soarpack", "peer")
# Where a text entry may be looked for; "eval" and "bench" are read by results.py, not by patterns.
TEXT_KINDS = ("prepare_env", "prepare_model", "quantize", "server", "check", "log")
RESULT_KINDS = ("eval", "bench")


@dataclass(frozen=True)
class Source:
    kind: str
    where: str
    text: str
    note: str = ""
    stack: str = ""  # packages only: "dev" (this venv) or "image" (the image stand-in)

    def describe(self) -> str:
        return f"{self.kind} {self.where}" + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Entry:
    id: str
    title: str
    severity: str
    cause: str
    fix: str
    kinds: Tuple[str, ...]
    patterns: Tuple[Pattern, ...]
    context: Dict[str, Pattern] = field(default_factory=dict)
    sources: Tuple[Source, ...] = ()
    example: str = ""
    unverified: bool = False

    def applies_to(self, kind: str) -> bool:
        return kind in self.kinds


def _entry(raw: dict) -> Entry:
    ident = raw.get("id")
    if not isinstance(ident, str) or not ident:
        raise ValueError(f"{CATALOGUE_PATH}: an entry has no id")
    where = f"{CATALOGUE_PATH} entry {ident}"
    known = {"id", "title", "severity", "kinds", "patterns", "context", "cause", "fix", "example", "unverified", "source"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
    for key in ("title", "cause", "fix"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ValueError(f"{where}: `{key}` must be a non-empty string")
    severity = raw.get("severity", "error")
    if severity not in SEVERITIES:
        raise ValueError(f"{where}: severity {severity!r} is not one of {SEVERITIES}")
    kinds = tuple(raw.get("kinds") or TEXT_KINDS)
    bad = [k for k in kinds if k not in TEXT_KINDS + RESULT_KINDS]
    if bad:
        raise ValueError(f"{where}: unknown kind(s) {bad}")
    try:
        patterns = tuple(re.compile(p) for p in raw.get("patterns") or [])
        context = {name: re.compile(p) for name, p in (raw.get("context") or {}).items()}
    except re.error as exc:
        raise ValueError(f"{where}: a pattern does not compile: {exc}") from None
    if not patterns and not set(kinds) <= set(RESULT_KINDS):
        raise ValueError(f"{where}: a text entry needs at least one pattern")
    sources = []
    for src in raw.get("source") or []:
        if src.get("kind") not in SOURCE_KINDS or not src.get("where") or not src.get("text"):
            raise ValueError(f"{where}: a source needs kind (one of {SOURCE_KINDS}), where and text")
        sources.append(Source(src["kind"], src["where"], src["text"], src.get("note", ""), src.get("stack", "")))
    unverified = bool(raw.get("unverified", False))
    if not sources and not unverified:
        raise ValueError(f"{where}: no source; cite one or mark the entry unverified = true")
    return Entry(ident, raw["title"], severity, raw["cause"].strip(), raw["fix"].strip(), kinds, patterns, context,
                 tuple(sources), raw.get("example", ""), unverified)


def load_catalogue(path: Optional[Path] = None) -> List[Entry]:
    """Every entry of the catalogue, in file order; ids are unique."""
    path = Path(path) if path is not None else CATALOGUE_PATH
    data = _toml.loads(path.read_text(encoding="utf-8"))
    entries = [_entry(raw) for raw in data.get("failure") or []]
    seen: Dict[str, int] = {}
    for entry in entries:
        seen[entry.id] = seen.get(entry.id, 0) + 1
    dupes = sorted(k for k, n in seen.items() if n > 1)
    if dupes:
        raise ValueError(f"{path}: duplicate id(s) {', '.join(dupes)}")
    return entries
