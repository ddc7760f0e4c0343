"""Bounded reading of the user's input files: every kind of input has a size cap, so `/dev/zero` or
`/dev/urandom` given as a data file ends in one error line, not in an out-of-memory kill.

A path is read as a stream, so a pipe (`/dev/fd/N`, `<(cmd)`) is input like any file; only a missing path or a
directory is refused up front. Lines are split on b"\\n" only (JSON Lines' separator): a U+2028 or U+0085 inside a
JSON string is text, not a line end, as `str.splitlines` would make it.
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path
from typing import Callable, Iterator, Optional, Tuple

from soarpack.errors import InputDataError

MiB = 2**20
CHUNK = MiB
# Caps by kind of input. The largest real inputs: a platform eval set of long-context rows is a few hundred MB at
# most; a calibration file a few MB (a bundle's shipped one is ~1 MB); a result JSON a few MB; a speed-set text
# or a recipe/profile a few kB.
MAX_DATA_BYTES = 1024 * MiB  # eval/bench data (JSONL)
MAX_CALIB_BYTES = 256 * MiB  # one calibration file
MAX_RESULT_BYTES = 256 * MiB  # an eval/bench result read back (resume, score, compare)
MAX_TEXT_BYTES = 64 * MiB  # a plain text input (speedset --text)
MAX_LINE_BYTES = 64 * MiB  # one JSONL line: a 128k-token question is ~0.5 MB
MAX_TOML_BYTES = 4 * MiB  # a recipe, profile or speed-set mix (a few kB)


def check_input_path(path: Path, what: str) -> None:
    """Refuse a path that cannot be read as a file: missing, or a directory. Pipes and devices are streams and
    are read (their size cap ends them)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputDataError(f"{what} {path} does not exist", "check the path") from None
    except OSError as exc:
        raise InputDataError(f"{what} {path} cannot be read ({exc.strerror or exc})", "check the path") from None
    if stat.S_ISDIR(mode):
        raise InputDataError(f"{what} {path} is a directory", "pass a file")


def _open(path: Path, what: str):
    check_input_path(path, what)
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InputDataError(f"{what} {path} cannot be read ({exc.strerror or exc})", "check the path") from None


def _too_big(path: Path, what: str, cap: int) -> InputDataError:
    return InputDataError(f"{what} {path} is larger than soarpack's cap of {cap // MiB:,} MiB for it",
                          "is this the right file? A device or an endless pipe never ends")


def read_bytes_capped(path: str | os.PathLike, what: str, cap: int) -> bytes:
    """The whole file, refused once it passes `cap` bytes (read in chunks: nothing past the cap is kept)."""
    path = Path(path)
    chunks, size = [], 0
    with _open(path, what) as fh:
        while True:
            chunk = fh.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                raise _too_big(path, what, cap)
            chunks.append(chunk)
    return b"".join(chunks)


def read_text_capped(path: str | os.PathLike, what: str, cap: int,
                     check_chunk: Optional[Callable[[str], None]] = None) -> str:
    """The whole file as UTF-8 text; bad UTF-8 is refused at the first bad chunk, not after reading to the cap;
    `check_chunk` sees each decoded chunk as it comes (to refuse binary data early)."""
    path = Path(path)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    parts = []
    for offset, chunk in _chunks(path, what, cap):
        try:
            parts.append(decoder.decode(chunk, final=not chunk))
        except UnicodeDecodeError as exc:
            raise InputDataError(f"{what} {path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                                 f"{offset + exc.start})", "re-save it as UTF-8") from None
        if check_chunk is not None and parts[-1]:
            check_chunk(parts[-1])
    return "".join(parts)


def _chunks(path: Path, what: str, cap: int) -> Iterator[Tuple[int, bytes]]:
    """(offset, chunk) of the file up to `cap` bytes (over it: refused), ending with an empty chunk."""
    size = 0
    with _open(path, what) as fh:
        while True:
            chunk = fh.read(CHUNK)
            if size + len(chunk) > cap:
                raise _too_big(path, what, cap)
            yield size, chunk
            size += len(chunk)
            if not chunk:
                return


def iter_lines(path: str | os.PathLike, what: str, cap: int,
               max_line: int = MAX_LINE_BYTES) -> Iterator[Tuple[int, str]]:
    """(1-based line number, line) of a JSONL file, split on b"\\n" only, each line decoded strictly as UTF-8.
    Refuses, naming the line: bad UTF-8, a raw NUL byte, a line over `max_line`, a file over `cap`."""
    path = Path(path)
    lineno = 0
    pending: list = []  # the pieces of the line not yet ended
    pending_size = 0
    for _, chunk in _chunks(path, what, cap):
        pieces = chunk.split(b"\n")
        if chunk:
            tail = pieces.pop()
        else:
            tail, pieces = b"", [b""] if pending else []
        for k, piece in enumerate(pieces):
            raw = b"".join(pending) + piece if k == 0 and pending else piece
            if k == 0:
                pending, pending_size = [], 0
            lineno += 1
            yield lineno, _decode_line(path, what, lineno, raw, max_line)
        pending.append(tail)
        pending_size += len(tail)
        if pending_size > max_line:
            raise _too_long(path, what, lineno + 1, max_line)
        if b"\0" in tail:  # found now, not after reading a NUL-filled line (/dev/zero) to the line cap
            raise _binary(path, lineno + 1)


def _too_long(path: Path, what: str, lineno: int, max_line: int) -> InputDataError:
    return InputDataError(f"{what} {path}: line {lineno} is longer than {max_line // MiB} MiB",
                          "one JSON object per line; is this the right file?")


def _decode_line(path: Path, what: str, lineno: int, raw: bytes, max_line: int) -> str:
    if len(raw) > max_line:
        raise _too_long(path, what, lineno, max_line)
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputDataError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})",
                             "re-save the file as UTF-8") from None
    if "\0" in line:
        raise _binary(path, lineno)
    return line


def _binary(path: Path, lineno: int) -> InputDataError:
    # A raw NUL byte is never valid JSON (inside a string it must be escaped as \u0000): binary data.
    return InputDataError(f"{path}:{lineno}: holds a NUL byte: binary data, not JSON Lines", "pass a UTF-8 JSONL file")
