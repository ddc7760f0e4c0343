"""What diagnose reads: log files, result JSON, and folders of them (a kept `check` rehearsal, a platform run).

Each input becomes one or more `Input`s with a kind: prepare_env, prepare_model, quantize, server, check (a check
report), log (any other text), eval or bench (soarpack's result files). A folder is walked for *.log, *.txt, *.out,
*.err and result JSON, skipping the trees a rehearsal leaves that hold no logs (venvs, wheels, models, sources).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, List, Optional

from soarpack.bench.evaluate import EVAL_KIND
from soarpack.bench.speed import BENCH_KIND
from soarpack.errors import InputDataError

MAX_READ_BYTES = 32 * 2**20  # a longer log is read from its end: the failure is there
MAX_JSON_BYTES = 1024 * 2**20  # a result file is read whole (150 long answers can pass 32 MiB)
MAX_FILES = 500
TEXT_SUFFIXES = (".log", ".txt", ".out", ".err")
# Folders of a rehearsal or a bundle that hold no logs, only (large) trees: never walked.
SKIP_DIRS = frozenset({".soarpack", "venv", ".venv", "image", "py310", "wheels", "src", "sglang", "sglang-fork",
                       "tiny-sala", "quantized", "site-packages", "__pycache__", "node_modules", ".git", "calib"})
CHECK_REPORT = "check.json"  # what a kept rehearsal folder holds beside its logs (soarpack.rehearse.check)


@dataclass
class Input:
    path: Path
    kind: str
    text: str = ""  # text kinds: the content (the last MAX_READ_BYTES of it)
    data: Optional[Any] = None  # eval / bench / check: the parsed JSON
    truncated: bool = False


def _read_text(path: Path) -> tuple:
    size = path.stat().st_size
    cap = MAX_JSON_BYTES if path.suffix.lower() == ".json" else MAX_READ_BYTES
    with open(path, "rb") as fh:
        if size > cap:
            fh.seek(size - cap)
        raw = fh.read(cap)
    return raw.decode("utf-8", errors="replace"), size > cap, raw


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


def read_file(path: Path, *, explicit: bool) -> Optional[Input]:
    """One file as an Input; None for a file a folder walk should pass over (not a log or a result)."""
    try:
        text, truncated, raw = _read_text(path)
    except OSError as exc:
        if explicit:
            raise InputDataError(f"cannot read {path} ({exc.strerror or exc})", "pass a log file or a folder of logs") from None
        return None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text) if not truncated else None
        except ValueError:
            data = None
        kind = json_kind(data)
        if kind is not None:
            return Input(path, kind, check_report_text(data) if kind == "check" else "", data)
        if not explicit:
            return None  # config.json, MANIFEST.json, ...: not a log
    if _looks_binary(raw):
        if explicit:
            raise InputDataError(f"{path} is a binary file, not a log", "pass a log file, an eval/bench JSON or a folder")
        return None
    if not explicit and path.suffix.lower() not in TEXT_SUFFIXES:
        return None
    return Input(path, text_kind(path.name, text), text, None, truncated)


def _walk(folder: Path) -> Iterable[Path]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".dist-info"))
        for name in sorted(files):
            yield Path(root) / name


def read_inputs(paths: List[Path]) -> List[Input]:
    """Every input under the given paths; a missing path, or nothing readable at all, is bad input."""
    if not paths:
        raise InputDataError("no log or folder given", "pass a log file, an eval/bench JSON or a folder of logs")
    found: List[Input] = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise InputDataError(f"{path} does not exist", "pass a log file, an eval/bench JSON or a folder of logs")
        if path.is_dir():
            before = len(found)
            for file in _walk(path):
                if len(found) >= MAX_FILES:
                    break
                if file.is_file() and not file.is_symlink():
                    item = read_file(file, explicit=False)
                    if item is not None:
                        found.append(item)
            if len(found) == before:
                raise InputDataError(f"{path} holds no log (*.log, *.txt, *.out, *.err) and no eval/bench/check result",
                                     "pass the folder that holds the logs, e.g. a kept `soarpack check` folder")
        else:
            found.append(read_file(path, explicit=True))
    return found
