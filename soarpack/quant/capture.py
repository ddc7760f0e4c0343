"""Send what the libraries print (GPTQModel's banners, bars and tables, torch and transformers warnings, nvcc and
Triton output) to a log file instead of the terminal, for the duration of a with-block.

Both levels are redirected: Python's `sys.stdout`/`sys.stderr` (what Python code prints, warnings included) and
the process's file descriptors 1 and 2 (C extensions, subprocesses, logging handlers made earlier on the real
stderr). Everything is restored on exit. Whoever still wants to reach the terminal keeps a stream opened before
(see soarpack.cli.progress).

On exit the block's `Captured` counts the warning lines the libraries wrote (`count_library_warnings`), so the
terminal can say `N library warnings: LOG` instead of showing them.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

# What a library's warning line looks like, anywhere in a line (GPTQModel's bars redraw in front of its log lines):
WARNING_LINE = re.compile(
    r"(?:^|\s)[WE]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ "  # torch's glog-style W/E lines: `W1201 12:02:37.46 24217 ...`
    r"|(?:^|[\s|\]%])(?:WARN|WARNING|ERROR|CRITICAL)\b[ :]"  # GPTQModel's `WARN  ...`, logging's `WARNING: ...`
    r"|\w*Warning: "  # Python's warnings: `file.py:726: FutureWarning: ...`
    r"|Failed to load \S"  # torchao's logger.warning about its optional CUDA extensions
)
# soarpack's own lines in the same log (soarpack.quant.run.RunLog) start with a timestamp: not a library's.
OWN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def count_library_warnings(lines: Iterable[str]) -> int:
    return sum(1 for line in lines if not OWN_LINE.match(line) and WARNING_LINE.search(line))


@dataclass
class Captured:
    """Where the libraries' output went, and (once the block is over) how many warning lines they wrote there."""

    log_file: Path
    warnings: int = 0

    def line(self) -> str:
        return f"{self.warnings} library warning{'s' if self.warnings != 1 else ''}: {self.log_file}"


COUNT_LINE = re.compile(r"^(\d+) library warnings?: (.+)$", re.M)  # what Captured.line() writes


def count_said(output: str) -> "tuple[int, str] | None":
    """(N, LOG) from the last `N library warnings: LOG` line a run printed (a subprocess's stdout), else None."""
    found = COUNT_LINE.findall(output)
    return (int(found[-1][0]), found[-1][1].strip()) if found else None


def _count_from(log_file: Path, offset: int) -> int:
    if not log_file.is_file():  # os.devnull: nothing kept, nothing to count
        return 0
    with open(log_file, "r", encoding="utf-8", errors="replace", newline="\n") as fh:
        fh.seek(offset)
        return count_library_warnings(fh)


@contextlib.contextmanager
def library_output_to(log_file: Path) -> Iterator[Captured]:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    fh = open(log_file, "a", buffering=1, encoding="utf-8", errors="replace")
    captured = Captured(Path(log_file))
    offset = os.fstat(fh.fileno()).st_size
    saved = {}
    try:
        for fd in (1, 2):
            try:
                saved[fd] = os.dup(fd)
            except OSError:  # no such descriptor (a daemon): nothing to redirect
                continue
            os.dup2(fh.fileno(), fd)
        before = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = fh
        try:
            yield captured
        finally:
            with contextlib.suppress(Exception):
                fh.flush()
            sys.stdout, sys.stderr = before
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        fh.close()
        with contextlib.suppress(OSError):
            captured.warnings = _count_from(captured.log_file, offset)
