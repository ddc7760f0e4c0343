"""What a set of calibration files holds before anything is tokenized: rows per file and the public tasks the rows
that carry a `task` cover; and the one line that says when fewer rows are used than were asked for.

quantize, calib and build report from here the rows actually used against the rows asked for, and where each came
from (soarpack.bundle.risks turns the same figures into a verdict's risks).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

# The five tasks of the public set perf_public_set.jsonl, 30 rows each (SALA.md section 2); the private set has
# the same mix.
PUBLIC_TASKS = ("mcq", "niah", "qa", "fwe", "cwe")
# Rows that carry a task should cover at least this many of them (docs/evidence.md#calibration: a mix of task types).
MIN_PUBLIC_TASKS = 3


def file_rows(path: Path, name: Optional[str] = None) -> Dict[str, Any]:
    """{file, rows, tasks}: the rows a calibration file holds, counted by the rule quantize reads it with
    (soarpack.quant.calib.row_lines: JSONL by suffix in any case or by content, else one text row) and, of the rows
    that carry a `task` field, how many of each task. Read after read_examples validated the file (and capped it)."""
    from soarpack.quant.calib import is_jsonl, row_lines

    path = Path(path)
    if not path.is_file():  # a pipe (<(cat f)) was read once, by read_examples: there is nothing to count again
        return {"file": name or path.name, "rows": None, "tasks": {}}
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = row_lines(path.name, text)
    tasks: Dict[str, int] = {}
    for line in lines if is_jsonl(path.name, text) else []:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            continue
        task = obj.get("task") if isinstance(obj, dict) else None
        if isinstance(task, str) and task:
            tasks[task] = tasks.get(task, 0) + 1
    return {"file": name or path.name, "rows": len(lines), "tasks": dict(sorted(tasks.items()))}


def sources_of(paths: Iterable[Path]) -> List[Dict[str, Any]]:
    return [file_rows(Path(p)) for p in paths]


def public_tasks_covered(sources: Iterable[Dict[str, Any]]) -> Optional[List[str]]:
    """The public tasks the task-carrying rows cover; None when no row carries a task."""
    seen = {t for s in sources for t in (s.get("tasks") or {})}
    if not seen:
        return None
    return [t for t in PUBLIC_TASKS if t in seen]


def where_from(sources: Iterable[Dict[str, Any]], builtin: bool = False) -> str:
    """`mine.jsonl (12 rows), more.txt (1 row)` or `the built-in synthetic prompts`."""
    if builtin:
        return "the built-in synthetic prompts"
    return ", ".join(f"{s['file']} (a stream, read once)" if s["rows"] is None else
                     f"{s['file']} ({s['rows']} row{'s' if s['rows'] != 1 else ''})" for s in sources)


def rows_line(used: int, asked: int, asked_by: str, where: str) -> str:
    """`calibration: 12 rows used of the 256 asked (recipe), from mine.jsonl (12 rows)`."""
    by = {"recipe": "by the recipe", "cli": "by --rows", "default": "soarpack's default"}.get(asked_by, f"by {asked_by}")
    return f"calibration: {used} rows used of the {asked} asked ({by}), from {where}"


def shortfall(used: int, asked: int, asked_by: str, where: str) -> Optional[str]:
    """A note when fewer rows are used than asked for; None when the ask is met."""
    if used >= asked:
        return None
    return (rows_line(used, asked, asked_by, where) + f": GPTQ's Hessians see {asked - used} fewer rows than asked "
            "(docs/evidence.md#calibration: at least 256 rows, a mix of lengths and tasks)")
