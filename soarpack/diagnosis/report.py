"""The human report of a Diagnosis, as lines: per input, its known failures (cause, fix, source) or the lines worth
reading; what was not read; the verdict. Every line goes through printable: log lines and file names are outside
text, and may hold terminal escapes."""

from __future__ import annotations

import json
import textwrap
from typing import List

from soarpack.printable import printable

WIDTH = 100


def _wrapped(label: str, text: str, indent: str = "    ") -> List[str]:
    first = f"{indent}{label}"
    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=indent + " " * len(label),
                         break_long_words=False, break_on_hyphens=False) or [first]


def render(diagnosis) -> List[str]:
    from soarpack.diagnosis import UNVERIFIED_NOTE

    lines: List[str] = []
    by_path = {}
    for f in diagnosis.findings:
        by_path.setdefault(f.path, []).append(f)
    excerpts = {x.path: x for x in diagnosis.excerpts}
    shown_paths = set()
    for inp in diagnosis.inputs:
        path = str(inp.path)
        found, x = by_path.get(path, []), excerpts.get(path)
        if (not found and x is None) or path in shown_paths:
            continue
        shown_paths.add(path)
        lines.append(f"{path}  [{inp.kind}]")
        for f in sorted(found, key=lambda f: not diagnosis.confirmed(f)):  # the verdicts first
            e = diagnosis.entry(f)
            lines.append(f"  {e.severity.upper()} {e.id}: {e.title}")
            lines.append(f"    {f.where}: {f.quote}" + (f"  ({f.count} matches)" if f.count > 1 else ""))
            shown = {k: v for k, v in f.detail.items() if k not in ("rows",)}
            if shown:
                lines.append("    found: " + ", ".join(f"{k} {json.dumps(v) if not isinstance(v, str) else v}"
                                                      for k, v in shown.items()))
            if e.unverified:
                lines.append(f"    UNVERIFIED: {UNVERIFIED_NOTE.split(': ', 1)[1]}")
            if not diagnosis.confirmed(f):
                why = ("a warning quotes this text; the failure is elsewhere" if f.quoted_in_warning
                       else "an unverified pattern on a line that is no error line")
                lines.append(f"    NOT A VERDICT: {why}")
            lines += _wrapped("cause: ", e.cause)
            lines += _wrapped("fix:   ", e.fix)
            for s in e.sources:
                lines.append(f"    source: {s.describe()}")
        if x is not None:
            lines.append("  no known failure explains it; the lines worth reading:")
            if x.first_error:
                lines.append(f"    first error: {x.first_error}")
            if x.last_traceback:
                lines.append("    last traceback:")
                lines += [f"      {line}" for line in x.last_traceback]
    for note in diagnosis.notes:
        lines.append(f"not read: {note}")
    n_files = len(diagnosis.inputs)
    part = " (in the part read)" if diagnosis.partial else ""
    verdicts = diagnosis.verdicts
    maybe = sorted({f.entry_id for f in diagnosis.findings if not diagnosis.confirmed(f)})
    also = f"; not a verdict: {', '.join(maybe)}" if maybe else ""
    if verdicts:
        ids = sorted({f.entry_id for f in verdicts})
        lines.append(f"{len(verdicts)} known failure(s) in {n_files} file(s){part}: {', '.join(ids)}{also}")
    elif diagnosis.excerpts:
        lines.append(f"no known failure in {n_files} file(s){part}; {len(diagnosis.excerpts)} hold errors shown "
                     f"above{also}")
    else:
        lines.append(f"no known failure and no error line in {n_files} file(s){part}{also}")
    return [printable(line) for line in lines]


__all__ = ["render"]
