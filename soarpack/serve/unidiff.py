"""Unified diffs, read and applied in pure Python (no `patch` or `git` binary on the platform).

A hunk is located by its whole "before" block (context + removed lines), searched for in the file and taken at
the match nearest to where the header says it should be (shifted by what earlier hunks moved), like GNU patch
without fuzz. A hunk whose "after" block is there instead counts as already applied. Anything else is a drift,
reported with the hunk's header line and the closest partial match in the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

from soarpack.errors import ConfigError

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass
class Hunk:
    old_start: int  # 1-based, as in the header
    new_start: int
    lines: List[Tuple[str, str]]  # (" " | "-" | "+", text without newline)
    patch_line: int  # line of the @@ header in the patch file, for messages

    @property
    def before(self) -> List[str]:
        return [t for tag, t in self.lines if tag in " -"]

    @property
    def after(self) -> List[str]:
        return [t for tag, t in self.lines if tag in " +"]

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{len(self.before)} +{self.new_start},{len(self.after)} @@"


@dataclass
class FileDiff:
    path: str  # relative to the tree root, without the a/ b/ prefix
    hunks: List[Hunk] = field(default_factory=list)


@dataclass
class HunkResult:
    index: int  # 1-based hunk number within the file
    status: str  # "apply" | "applied" | "fail"
    line: int  # 1-based line in the target file where it matched, or where it was expected
    detail: str = ""


def _split(text: str) -> List[str]:
    # Only "\n" ends a line: str.splitlines() would also split on form feeds and other separators in the source.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _strip_prefix(raw: str) -> str:
    name = raw.split("\t", 1)[0].strip()
    if name.startswith(("a/", "b/")):
        name = name[2:]
    return name


def parse_unified_diff(text: str, source: str = "<patch>") -> Tuple[str, List[FileDiff]]:
    """Split a patch file into its free-text header (the description) and its file diffs."""
    lines = _split(text)
    description: List[str] = []
    files: List[FileDiff] = []
    i = 0
    while i < len(lines) and not (lines[i].startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ ")):
        description.append(lines[i])
        i += 1
    current: Optional[FileDiff] = None
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            current = FileDiff(_strip_prefix(lines[i + 1][4:]))
            files.append(current)
            i += 2
            continue
        m = _HUNK_RE.match(line)
        if m:
            if current is None:
                raise ConfigError(f"{source}:{i + 1}: hunk before any '---/+++' file header", "regenerate the patch with diff -u")
            old_len = int(m.group(2) or 1)
            new_len = int(m.group(4) or 1)
            hunk = Hunk(int(m.group(1)), int(m.group(3)), [], i + 1)
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len):
                body = lines[i]
                if body.startswith("\\"):  # "\ No newline at end of file"
                    i += 1
                    continue
                tag, text_ = (body[:1] or " "), body[1:]
                if tag not in " -+":
                    raise ConfigError(f"{source}:{i + 1}: hunk line does not start with ' ', '-' or '+'", "the patch is truncated or was re-wrapped")
                hunk.lines.append((tag, text_))
                seen_old += tag in " -"
                seen_new += tag in " +"
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise ConfigError(f"{source}:{hunk.patch_line}: hunk is shorter than its header says", "the patch is truncated")
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            current.hunks.append(hunk)
            continue
        if line.strip() and current is not None and not line.startswith(("diff ", "index ", "Only in ")):
            raise ConfigError(f"{source}:{i + 1}: unexpected line between hunks: {line[:60]!r}", "the patch is malformed")
        i += 1
    return "\n".join(description).strip(), files


def _find_all(lines: List[str], block: List[str]) -> List[int]:
    if not block:
        return []
    n = len(block)
    first = block[0]
    return [i for i in range(len(lines) - n + 1) if lines[i] == first and lines[i:i + n] == block]


def _nearest(candidates: List[int], expected: int) -> int:
    return min(candidates, key=lambda i: (abs(i - expected), i))


def _closest_partial(lines: List[str], block: List[str], expected: int) -> Tuple[Optional[int], str]:
    """Where the file comes closest to the block: (1-based line that differs there, a description)."""
    best, best_score = None, 0
    n = len(block)
    for i in range(max(1, len(lines) - n + 1)):
        score = sum(1 for a, b in zip(lines[i:i + n], block) if a == b)
        if score > best_score or (score == best_score and best is not None and abs(i - expected) < abs(best - expected)):
            best, best_score = i, score
    if best is None:
        return None, f"none of its {n} lines occur in the file"
    for k, want in enumerate(block):
        have = lines[best + k] if best + k < len(lines) else "<end of file>"
        if have != want:
            return best + k + 1, f"the file has {have.strip()[:70]!r} where the patch expects {want.strip()[:70]!r}"
    return best + 1, "closest match"  # pragma: no cover - a full match is found before we get here


def apply_file_diff(text: str, diff: FileDiff) -> Tuple[str, List[HunkResult]]:
    """Apply the hunks that apply; report each. The caller decides whether a partial result may be used."""
    keep_final_newline = text.endswith("\n")
    lines = _split(text)
    results: List[HunkResult] = []
    written: List[Tuple[int, int, int, int]] = []  # (start, end, hunk, expected line) of text this pass wrote
    offset = 0
    for number, hunk in enumerate(diff.hunks, start=1):
        before, after = hunk.before, hunk.after
        expected = max(0, hunk.old_start - 1 + offset)
        matches = _find_all(lines, before)
        if matches:
            at = _nearest(matches, expected)
            lines[at:at + len(before)] = after
            delta = len(after) - len(before)
            written = [(s + delta, e + delta, n, x) if s >= at + len(before) else (s, e, n, x) for s, e, n, x in written]
            written.append((at, at + len(after), number, hunk.old_start))
            offset = at - (hunk.old_start - 1) + delta
            results.append(HunkResult(number, "apply", at + 1))
            continue
        done = _find_all(lines, after)
        if done:
            at = _nearest(done, max(0, hunk.new_start - 1 + offset))
            taken = [(n, s, x) for s, e, n, x in written if s < at + len(after) and at < e]
            if taken:
                # Not applied before: an earlier hunk of this pass matched here, away from its own place, because
                # the text at its own place differs. Both hunks' places are then wrong; report this one.
                other, start, other_expected = taken[0]
                results.append(HunkResult(number, "fail", hunk.old_start,
                                          f"expected near line {hunk.old_start}; its lines were taken by hunk {other}, "
                                          f"which matched at line {start + 1} instead of near line {other_expected}: "
                                          f"the file differs from the patch near line {other_expected}"))
                continue
            offset = at - (hunk.new_start - 1)
            results.append(HunkResult(number, "applied", at + 1))
            continue
        line, detail = _closest_partial(lines, before, expected)
        where = f"expected near line {hunk.old_start}"
        results.append(HunkResult(number, "fail", line or hunk.old_start, f"{where}; {detail}"))
    out = "\n".join(lines)
    if keep_final_newline or not text:
        out += "\n"
    return out, results


def read_patch(path: Path) -> Tuple[str, List[FileDiff]]:
    return parse_unified_diff(Path(path).read_text(encoding="utf-8"), source=str(path))
