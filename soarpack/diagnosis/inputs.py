"""What diagnose reads: log files, result JSON, and folders of them (a kept `check` rehearsal, a platform run).

Each input becomes one or more `Input`s with a kind: prepare_env, prepare_model, quantize, server, check (a check
report), log (any other text), eval or bench (soarpack's result files). A folder is walked for *.log, *.txt, *.out,
*.err and result JSON, skipping the trees a rehearsal leaves that hold no logs (venvs, wheels, models, sources).

Inputs are read one at a time (iter_inputs), so memory holds one file's tail, not every file's. What was not read
is said, never skipped silently (`notes`): the start of a log longer than MAX_READ_BYTES, the files past MAX_FILES,
a JSON file nested too deep to parse. Only regular files and pipes are read: a device, a socket or a FIFO is never
opened in a way that blocks (a FIFO without a writer reads as empty).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, List, Optional

from soarpack.measure.evaluate import EVAL_KIND
from soarpack.measure.speed import BENCH_KIND
from soarpack.errors import InputDataError

MAX_READ_BYTES = 32 * 2**20  # a longer log is read from its end: the failure is there
MAX_JSON_BYTES = 1024 * 2**20  # a result file is read whole (150 long answers can pass 32 MiB)
MAX_FILES = 500
MAX_PIPE_BYTES = 1024 * 2**20  # a pipe (`diagnose <(cmd)`) is read to its end or this much, its tail kept
TEXT_SUFFIXES = (".log", ".txt", ".out", ".err")
# Folders of a rehearsal or a bundle that hold no logs, only (large) trees: never walked.
SKIP_DIRS = frozenset({".soarpack", "venv", ".venv", "image", "py310", "wheels", "src", "sglang", "sglang-fork",
                       "tiny-sala", "quantized", "site-packages", "__pycache__", "node_modules", ".git", "calib"})
@dataclass
class Input:
    path: Path
    kind: str
    text: str = ""  # text kinds: the content (the last MAX_READ_BYTES of it); emptied once it is diagnosed
    data: Optional[Any] = None  # eval / bench / check: the parsed JSON
    truncated: bool = False
    size: Optional[int] = None  # bytes the file holds (None: a pipe)
    read_from: int = 0  # the offset its reading started at (> 0: its start was not read)

    def read_part(self) -> str:
        """Which part was read, in words ("" when the whole file was)."""
        if not self.truncated:
            return ""
        if self.size is None:
            return f"only the last {MAX_READ_BYTES // 2**20} MiB of the pipe's output was kept"
        return (f"only its last {(self.size - self.read_from) / 2**20:.0f} MiB were read (bytes {self.read_from:,} to "
                f"{self.size:,}); a failure in its first {self.read_from / 2**20:.0f} MiB is not seen")


class NotAFile(Exception):
    """The path is a device, a socket or another thing that is no log (raised before anything is read)."""


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def _open(path: Path) -> tuple:
    """An fd on a regular file or a FIFO, opened without blocking (a FIFO with no writer would block an open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # reads wait for a writer
        return fd, st
    os.close(fd)
    what = next((words for test, words in _KINDS if test(st.st_mode)), "not a regular file")
    raise NotAFile(what)


def _read_text(path: Path) -> tuple:
    """(text, truncated, raw bytes, size or None for a pipe, offset read from)."""
    cap = MAX_JSON_BYTES if path.suffix.lower() == ".json" else MAX_READ_BYTES
    fd, st = _open(path)
    with os.fdopen(fd, "rb") as fh:
        if stat.S_ISREG(st.st_mode):
            size = st.st_size
            start = max(0, size - cap)
            fh.seek(start)
            raw = fh.read(cap)
            truncated = start > 0
        else:  # a pipe: read to its end (bounded), keeping the tail
            size, start, raw, seen = None, 0, b"", 0
            while seen < MAX_PIPE_BYTES:
                block = fh.read(min(1 << 20, MAX_PIPE_BYTES - seen))
                if not block:
                    break
                seen += len(block)
                raw = (raw + block)[-cap:]
                if seen <= 8192 and _looks_binary(raw):
                    break
            truncated = seen > len(raw)
    return raw.decode("utf-8", errors="replace"), truncated, raw, size, start


def _looks_binary(raw: bytes) -> bool:
    return b"\0" in raw[:8192]


def text_kind(name: str, text: str) -> str:
    """The kind of a text log, from its name first, then from lines only that writer prints."""
    lowered = name.lower()
    for kind in ("prepare_env", "prepare_model", "quantize", "server"):
        if lowered.startswith(kind) or lowered.startswith(kind.replace("_", "-")):
            return kind
    head = text[:200_000]
    if "[soarpack prepare_env " in head:
        return "prepare_env"
    if "[prepare_model.sh " in head or "[preprocess_model " in head:
        return "prepare_model"
    if "server_args=ServerArgs(" in head or "sglang.launch_server" in head:
        return "server"
    return "log"


def json_kind(data: Any) -> Optional[str]:
    if isinstance(data, dict):
        if data.get("kind") == EVAL_KIND:
            return "eval"
        if data.get("kind") == BENCH_KIND:
            return "bench"
        if isinstance(data.get("steps"), list) and "uploadable" in data:
            return "check"
    return None


def check_report_text(report: dict) -> str:
    """The lines of a check report worth matching: each failed step as `NAME: DETAIL`."""
    return "\n".join(f"{step.get('name')}: {step.get('detail', '')}" for step in report.get("steps", [])
                     if isinstance(step, dict) and step.get("status") == "fail")


def read_file(path: Path, *, explicit: bool, notes: Optional[List[str]] = None) -> Optional[Input]:
    """One file as an Input; None for a file a folder walk should pass over (not a log or a result)."""
    notes = notes if notes is not None else []
    try:
        text, truncated, raw, size, start = _read_text(path)
    except NotAFile as exc:
        if explicit:
            raise InputDataError(f"{path} is {exc}, not a log file", "pass a log file, an eval/bench JSON or a folder") from None
        return None
    except OSError as exc:
        if explicit:
            raise InputDataError(f"cannot read {path} ({exc.strerror or exc})", "pass a log file or a folder of logs") from None
        return None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text) if not truncated else None
        except ValueError:
            data = None
        except RecursionError:
            if explicit:
                raise InputDataError(f"{path} is JSON nested too deep to read (deeper than Python's JSON reader goes)",
                                     "pass the eval/bench JSON that soarpack wrote") from None
            notes.append(f"{path}: not read: JSON nested too deep to parse")
            return None
        kind = json_kind(data)
        if kind is not None:
            return Input(path, kind, check_report_text(data) if kind == "check" else "", data, size=size)
        if not explicit:
            return None  # config.json, MANIFEST.json, ...: not a log
    if _looks_binary(raw):
        if explicit:
            raise InputDataError(f"{path} is a binary file, not a log", "pass a log file, an eval/bench JSON or a folder")
        return None
    if not explicit and path.suffix.lower() not in TEXT_SUFFIXES:
        return None
    if size is None and not raw:
        notes.append(f"{path}: a pipe that gave nothing to read (no writer, or it wrote nothing)")
    inp = Input(path, text_kind(path.name, text), text, None, truncated, size, start)
    if truncated:
        notes.append(f"{path}: {inp.read_part()}")
    return inp


def _walk(folder: Path) -> Iterable[Path]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".dist-info"))
        for name in sorted(files):
            yield Path(root) / name


def iter_inputs(paths: List[Path], notes: Optional[List[str]] = None) -> Iterator[Input]:
    """Every input under the given paths, one at a time; a missing path, or nothing readable at all, is bad input.
    What is not read (past MAX_FILES, a log's start) is said in `notes`."""
    notes = notes if notes is not None else []
    if not paths:
        raise InputDataError("no log or folder given", "pass a log file, an eval/bench JSON or a folder of logs")
    for path in paths:
        if not Path(path).exists() and not Path(path).is_symlink():
            raise InputDataError(f"{path} does not exist", "pass a log file, an eval/bench JSON or a folder of logs")
    found = 0
    for path in paths:
        path = Path(path)
        if path.is_dir():
            before = found
            for file in _walk(path):
                if file.is_file() and not file.is_symlink():
                    if found >= MAX_FILES:
                        notes.append(f"{path}: stopped after {MAX_FILES} files: the rest of the folder (from {file}) "
                                     "was not read; pass a narrower folder")
                        break
                    item = read_file(file, explicit=False, notes=notes)
                    if item is not None:
                        found += 1
                        yield item
            if found == before:
                raise InputDataError(f"{path} holds no log (*.log, *.txt, *.out, *.err) and no eval/bench/check result",
                                     "pass the folder that holds the logs, e.g. a kept `soarpack check` folder")
        else:
            found += 1
            yield read_file(path, explicit=True, notes=notes)
