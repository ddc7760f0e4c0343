"""Text logs against the catalogue: each entry's patterns, line by line; and, for a log that no error entry names,
the lines worth reading (its first error line and its last traceback), so an unknown failure is never silent."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from soarpack.diagnosis.catalogue import Entry
from soarpack.diagnosis.inputs import Input

# What marks a line as an error in the logs diagnose reads: Python's exception lines, soarpack's `error:` lines and
# `!!!` banners, loud levels, and the few words a dying process prints. Not a bare "error" (a successful quantize
# prints "dequantization error" tables) nor "0 failed".
# (`Error:` alone stands for `\b\w*Error\b:`, the same lines, searched as a literal: ten times faster on a long log.)
ERROR_LINE = re.compile(r"Traceback \(most recent call last\)|(?:Error|Exception):|\bERROR\b|(?i:\berror:)"
                        r"|\bFAIL(?:ED)?\b|\bfailed\b(?! *[:=]? *0\b)|(?i:\bfatal\b)|\bKilled\b|Segmentation fault"
                        r"|core dumped|!!! ")
# Texts one of which every error line holds (ERROR_LINE's literals; the case-free ones lowercased): a log that holds
# none has no error line, found by substring searches, far faster over a long log than the regex.
_ERROR_LITERALS = ("Traceback (most recent call last)", "Error:", "Exception:", "ERROR", "FAIL", "failed", "Killed",
                   "Segmentation fault", "core dumped", "!!! ")
_ERROR_LITERALS_ANY_CASE = ("error:", "fatal")


def may_hold_errors(text: str) -> bool:
    """False only when no line of `text` can be an error line."""
    if any(literal in text for literal in _ERROR_LITERALS):
        return True
    lowered = text.lower()
    return any(literal in lowered for literal in _ERROR_LITERALS_ANY_CASE)


# What marks a line as a warning: a loud level, Python's warnings. A catalogue signature behind such a marker is a
# warning quoting the text (a retry note, a hint), not the failure itself.
WARNING_LINE = re.compile(r"\bWARN(?:ING)?\b|(?i:\bwarning\b)|\b\w*Warning\b|warnings\.warn|^\s*W\d{4}\b")
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
    quoted_in_warning: bool = False  # every hit is behind a warning marker: the text is quoted, not the failure
    on_error_line: bool = True  # the line quoted is itself an error line (an exception, ERROR, error:, ...)


@dataclass
class Excerpt:
    """The lines worth reading of a log that no known error explains."""

    path: str
    kind: str
    first_error: Optional[str] = None  # "line N: text"
    last_traceback: List[str] = field(default_factory=list)


def warned_before(line: str, at: int) -> bool:
    """Whether a warning marker stands on the line before position `at` (the signature is quoted by a warning)."""
    marker = WARNING_LINE.search(line)
    return marker is not None and marker.start() < at


def is_error_line(line: str) -> bool:
    """An error line of a log, not a warning that quotes an error's text."""
    match = ERROR_LINE.search(line)
    return match is not None and not warned_before(line, match.start())


@functools.lru_cache(maxsize=None)
def _anywhere(pattern: "re.Pattern") -> "re.Pattern":
    """The pattern searched over a whole text at once: `^`/`$` at each line. It matches wherever a line of the
    text matches (and maybe more), so a miss over the whole text is a miss on every line."""
    return re.compile(pattern.pattern, pattern.flags | re.MULTILINE)


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


def match_entries(inp: Input, entries: List[Entry], others: Optional[List[Input]] = None) -> List[Finding]:
    """Every entry that applies to this input's kind and whose pattern matches a line of it. The line quoted is the
    first real hit: not indented (a traceback quotes the raising source line before the message) and not behind a
    warning marker; a finding whose every hit is quoted by a warning says so (quoted_in_warning)."""
    lines = None
    findings = []
    for entry in entries:
        if not entry.patterns or not entry.applies_to(inp.kind):
            continue
        if not any(_anywhere(p).search(inp.text) for p in entry.patterns):
            continue  # one pass over the text: no line can match (most entries, most logs)
        lines = inp.text.splitlines() if lines is None else lines
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
        real = [h for h in hits if not warned_before(h[1], h[2].start())]
        ranked = real or hits
        number, line, match = next((h for h in ranked if not h[1][:1].isspace()), ranked[0])
        detail = _named_groups(match)
        detail.update(context_values(entry, [inp.text] + [o.text for o in others or [] if o is not inp and o.text]))
        where = f"line {number}" + (" of the log's last 32 MiB" if inp.truncated else "")
        quoted = not real and entry.severity == "error"
        if quoted:
            where += " (only quoted by a warning line: not taken for the cause)"
        on_error = inp.kind == "check" or is_error_line(line)
        findings.append(Finding(entry.id, str(inp.path), inp.kind, where, _clip(line), count, detail, quoted, on_error))
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
    if inp.kind != "check" and not may_hold_errors(inp.text):
        return None  # no error line anywhere (a traceback's header is one): nothing to show
    lines = inp.text.splitlines()
    # A check report's text is its failed steps (inputs.check_report_text): each line is an error.
    is_error = (lambda line: bool(line.strip())) if inp.kind == "check" else is_error_line
    first = next(((n, line) for n, line in enumerate(lines, 1) if is_error(line)), None)
    tb = last_traceback(lines)
    if first is None and not tb:
        return None
    return Excerpt(str(inp.path), inp.kind, f"line {first[0]}: {_clip(first[1].strip())}" if first else None, tb)
