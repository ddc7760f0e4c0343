"""Text logs against the catalogue: each entry's patterns, line by line; and, for a log that no error entry names,
the lines worth reading (its first error line and its last traceback), so an unknown failure is never silent."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from soarpack.diagnose.catalogue import Entry
from soarpack.diagnose.inputs import Input

# What marks a line as an error in the logs diagnose reads: Python's exception lines, soarpack's `error:` lines and
# `!!!` banners, loud levels, and the few words a dying process prints. Not a bare "error" (a successful quantize
# prints "dequantization error" tables) nor "0 failed".
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|\b\w*(?:Error|Exception)\b:|\bERROR\b|(?i:\berror:)"
                        r"|\bFAIL(?:ED)?\b|\bfailed\b(?! *[:=]? *0\b)|(?i:\bfatal\b)|\bKilled\b|Segmentation fault"
                        r"|core dumped|!!! ")
TRACEBACK = "Traceback (most recent call last):"
TRACEBACK_FRAMES_KEPT = 6  # frame lines kept before the exception line
MAX_QUOTE = 400


@dataclass
class Finding:
    entry_id: str
    path: str
    kind: str
    where: str  # "line 57" in a log, "12 of 150 rows" in a result
    quote: str
    count: int = 1
    detail: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Excerpt:
    """The lines worth reading of a log that no known error explains."""

    path: str
    kind: str
    first_error: Optional[str] = None  # "line N: text"
    last_traceback: List[str] = field(default_factory=list)


def _clip(line: str) -> str:
    line = line.rstrip()
    return line if len(line) <= MAX_QUOTE else line[:MAX_QUOTE] + " ..."


def _named_groups(match: "re.Match") -> Dict[str, str]:
    return {k.rstrip("0123456789"): v for k, v in match.groupdict().items() if v is not None}


def context_values(entry: Entry, texts: List[str]) -> Dict[str, str]:
    """Each of the entry's context values: its last match in the first text that has one (the failing log first)."""
    values: Dict[str, str] = {}
    for name, pattern in entry.context.items():
        for text in texts:
            matches = pattern.findall(text)
            if matches:
                values[name] = matches[-1] if isinstance(matches[-1], str) else matches[-1][0]
                break
    return values


def match_entries(inp: Input, entries: List[Entry], others: List[Input]) -> List[Finding]:
    """Every entry that applies to this input's kind and whose pattern matches a line of it."""
    lines = inp.text.splitlines()
    findings = []
    for entry in entries:
        if not entry.patterns or not entry.applies_to(inp.kind):
            continue
        hits = []
        for number, line in enumerate(lines, 1):
            for pattern in entry.patterns:
                match = pattern.search(line)
                if match:
                    hits.append((number, line, match))
                    break
        if not hits:
            continue
        count = len(hits)
        # A traceback quotes the raising source line (indented) before the message itself: quote the message.
        number, line, match = next((h for h in hits if not h[1][:1].isspace()), hits[0])
        detail = _named_groups(match)
        detail.update(context_values(entry, [inp.text] + [o.text for o in others if o is not inp and o.text]))
        where = f"line {number}" + (" of the log's last 32 MiB" if inp.truncated else "")
        findings.append(Finding(entry.id, str(inp.path), inp.kind, where, _clip(line), count, detail))
    return findings


def last_traceback(lines: List[str]) -> List[str]:
    """The last `Traceback (most recent call last):` block: its header, its last frames and the exception line(s)."""
    starts = [i for i, line in enumerate(lines) if line.strip().endswith(TRACEBACK)]
    if not starts:
        return []
    start = starts[-1]
    body = []
    for line in lines[start + 1:]:
        stripped = line.strip()
        if not stripped:
            if body and not body[-1].startswith((" ", "\t")):
                break
            continue
        body.append(line.rstrip())
        # The exception line is the first one that is not indented (frames and code are).
        if not line.startswith((" ", "\t")) and not stripped.startswith("File "):
            break
    frames = body[:-1][-TRACEBACK_FRAMES_KEPT:]
    skipped = len(body) - 1 - len(frames)
    head = [lines[start].rstrip()] + ([f"  ... {skipped} line(s) ..."] if skipped > 0 else [])
    return head + frames + body[-1:]


def excerpt(inp: Input) -> Optional[Excerpt]:
    """The first error line and the last traceback of a log; None when it has neither."""
    lines = inp.text.splitlines()
    # A check report's text is its failed steps (inputs.check_report_text): each line is an error.
    is_error = (lambda line: bool(line.strip())) if inp.kind == "check" else ERROR_LINE.search
    first = next(((n, line) for n, line in enumerate(lines, 1) if is_error(line)), None)
    tb = last_traceback(lines)
    if first is None and not tb:
        return None
    return Excerpt(str(inp.path), inp.kind, f"line {first[0]}: {_clip(first[1].strip())}" if first else None, tb)
