"""Send what the libraries print (GPTQModel's banners, bars and tables, torch and transformers warnings, nvcc and
Triton output) to a log file instead of the terminal, for the duration of a with-block.

Both levels are redirected: Python's `sys.stdout`/`sys.stderr` (what Python code prints, warnings included) and
the process's file descriptors 1 and 2 (C extensions, subprocesses, logging handlers made earlier on the real
stderr). Everything is restored on exit. Whoever still wants to reach the terminal keeps a stream opened before
(see soarpack.cli.progress).
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def library_output_to(log_file: Path) -> Iterator[None]:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    fh = open(log_file, "a", buffering=1, encoding="utf-8", errors="replace")
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
            yield
        finally:
            with contextlib.suppress(Exception):
                fh.flush()
            sys.stdout, sys.stderr = before
    finally:
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        fh.close()
