"""Refuse to ship anything that looks like a credential: the bundle is uploaded to a third party.

One scanner sees every member of the bundle: every name (a token in a file's name is refused as in its content),
every byte of every file (in overlapping blocks, whatever its size or suffix), and every member of what is
compressed or archived, judged by its first bytes (gzip, bzip2, xz, zip and wheels, tar: a `.gz`, a `.tar.gz` in
the tree or in a wheel), by name and content, nested up to MAX_NESTING deep; what expands past a ratio or a budget
(a compression bomb) is refused, not unpacked. UTF-16 and UTF-32 text (with or without a BOM) is read as text.
Each block is searched three ways:
- the raw bytes, with token patterns whose left edge also holds after a backslash escape (`\\n`, `\\t`, `\\u00e9`):
  in JSON a newline is the two characters `\\n`, so a token that starts a line follows the letter `n`;
- the strings of JSON and JSONL content (by suffix, or content that starts with `{`/`[`), decoded, so a token
  written with `\\uXXXX` escapes or an `aws_secret_access_key` behind escaped quotes is seen as it reads;
- base64 runs, decoded: a PEM private key, an OpenSSH or DER private key, or a token, encoded, is caught.
The one exception is a wheel whose sha256 is pinned in the platform lock: it is the published artifact, and
third-party test fixtures inside it are not ours. `build` and `check` decide with the same function, scan_tree, on
the same tree (build's once MANIFEST.json is written), so build refuses exactly what check would.

The rules are hand-written, not a maintained rule set such as detect-secrets: the scan must run in `soarpack check`
with no extra installed, over binary files and archive members (detect-secrets reads text lines), and its keyword
and entropy plugins flag hashes and ids that calibration text and source trees are full of.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import re
import zipfile
from pathlib import Path
from typing import BinaryIO, FrozenSet, Iterable, Optional

from soarpack.errors import SoarpackError

# File or folder names that are credentials (or carry them) whatever their content.
FORBIDDEN_NAMES = {
    ".git", ".netrc", "_netrc", ".pypirc", ".env", ".git-credentials", ".npmrc", ".dockercfg",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", ".huggingface", "credentials", ".aws", ".ssh",
}
FORBIDDEN_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".keystore")
# huggingface_hub keeps the login token in a pattern-less file: ~/.cache/huggingface/token (and stored_tokens).
FORBIDDEN_IN_FOLDER = {"huggingface": ("token", "stored_tokens")}
# A packed name keeps the original behind an index (calib/00-.env): the rules see through it.
_PACKED_PREFIX = re.compile(r"^\d+-")

_HF_SHORT = rb"hf_(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[A-Z])(?=[A-Za-z0-9]*[a-z])[A-Za-z0-9]{10,29}"
_QUOTE = rb"(?:\\?[\"'])?"  # a quote, or an escaped one inside a JSON string
_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_HEX = frozenset(b"0123456789ABCDEFabcdef")


def _starts_a_token(data: bytes, at: int) -> bool:
    """Whether a token may start at `at`: not inside a word (as `\\b`), but also right after a backslash escape,
    whose last character is a letter or hex digit: `\\n`, `\\t` (JSON, Python), `\\u00e9`, `\\x0a`."""
    if at == 0 or data[at - 1] not in _WORD:
        return True
    if at >= 2 and data[at - 2] == 0x5C and data[at - 1] in b"nrtbfv0":
        return True
    if at >= 6 and data[at - 6:at - 4] == b"\\u" and all(c in _HEX for c in data[at - 4:at]):
        return True
    return at >= 4 and data[at - 4:at - 2] == b"\\x" and all(c in _HEX for c in data[at - 2:at])


class _Token:
    """A token format with a recognizable prefix; `search` is true where a match starts a token. The left edge
    is checked per match (a lookbehind in front of the prefix would make every search several times slower)."""

    def __init__(self, pattern: bytes):
        self.pattern = re.compile(pattern)

    def search(self, data: bytes) -> bool:
        return any(_starts_a_token(data, m.start()) for m in self.pattern.finditer(data))


# Content patterns: token formats with a recognizable prefix, PEM/PGP private keys, and an AWS secret key only
# beside its name (40 base64 characters alone are as often a sha1).
SECRET_PATTERNS = [
    ("a private key", re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")),
    ("a Hugging Face token", _Token(rb"(?:hf_[A-Za-z0-9]{30,}|" + _HF_SHORT + rb")\b")),
    ("a GitHub token", _Token(rb"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})\b")),
    ("a GitLab token", _Token(rb"glpat-[A-Za-z0-9_-]{20,}")),
    ("a Google API key", _Token(rb"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])")),
    ("an AWS access key", _Token(rb"(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("an AWS secret access key",
     re.compile(rb"(?i)aws_?secret_?(?:access_?)?key" + _QUOTE + rb"\s*[:=]\s*" + _QUOTE
                + rb"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")),
    ("an OpenAI-style API key", _Token(rb"sk-(?:proj-)?[A-Za-z0-9_-]{32,}\b")),
    ("a Slack token", _Token(rb"xox[abprs]-[A-Za-z0-9-]{10,}\b")),
    ("a PyPI token", _Token(rb"pypi-[A-Za-z0-9_-]{50,}\b")),
]

# A base64 run long enough to hold a PEM header or a key (standard or URL-safe alphabet); each is decoded at the
# four alignments (its first characters may belong to something else, e.g. the `n` of a `\n` before it).
_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{40}[A-Za-z0-9+/_-]*")
_URLSAFE = bytes.maketrans(b"-_", b"+/")
BASE64_DECODE_CHARS = 1 << 20  # of one run: a key is at its start, a secret deeper in a 1 MiB blob is still seen
OPENSSH_MAGIC = b"openssh-key-v1\0"

BLOCK_BYTES = 1 << 20
# Longer than any match the patterns need, so a secret cut by a block edge is whole in the next block.
OVERLAP_BYTES = 4096
ZIP_MAGIC = b"PK\x03\x04"
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
# A JSON document up to this size is decoded whole; a larger one line by line (JSONL).
JSON_WHOLE_BYTES = 64 << 20


class CredentialError(SoarpackError):
    """The bundle tree holds a file that looks like a credential."""


def _refuse(name: str, problem: str) -> CredentialError:
    return CredentialError(f"refusing to bundle {redacted(name)}: it {problem}",
                           "remove the file (or the secret from it) from the inputs and build again")


def _b64decode(run: bytes) -> bytes:
    run = run[: len(run) - len(run) % 4].translate(_URLSAFE)
    try:
        return base64.b64decode(run)
    except (binascii.Error, ValueError):
        return b""


def _der_sequence_body(data: bytes) -> Optional[int]:
    """Offset past a DER SEQUENCE header (tag 0x30 and its length), or None."""
    if len(data) < 8 or data[0] != 0x30:
        return None
    first = data[1]
    if first < 0x80:
        return 2
    if first in (0x81, 0x82, 0x83):
        return 2 + (first - 0x80)
    return None


def _is_private_key_blob(data: bytes) -> bool:
    """An OpenSSH private key, or a DER private key (PKCS#1 RSA, PKCS#8, SEC1 EC): a SEQUENCE whose first member is
    the version INTEGER 0 followed by a SEQUENCE or INTEGER, or version 1 followed by an OCTET STRING (EC).
    A certificate or public key starts with a SEQUENCE inside the SEQUENCE, never with a version number."""
    if data.startswith(OPENSSH_MAGIC):
        return True
    at = _der_sequence_body(data)
    if at is None:
        return False
    head = data[at:at + 4]
    return (head[:3] == b"\x02\x01\x00" and head[3:4] in (b"\x30", b"\x02")) or head == b"\x02\x01\x01\x04"


def _find_encoded_secret(data: bytes) -> Optional[str]:
    for match in _BASE64_RUN.finditer(data):
        run = match.group()[:BASE64_DECODE_CHARS]
        for offset in range(4):
            decoded = _b64decode(run[offset:])
            if not decoded:
                continue
            if _is_private_key_blob(decoded):
                return "a private key (base64-encoded)"
            what = find_secret(decoded, decode_base64=False)
            if what:
                return f"{what} (base64-encoded)"
    return None


def find_secret(data: bytes, *, decode_base64: bool = True) -> Optional[str]:
    """What credential `data` looks like it holds, or None: the patterns, then its base64 runs decoded."""
    for what, pattern in SECRET_PATTERNS:
        if pattern.search(data):
            return what
    return _find_encoded_secret(data) if decode_base64 else None


def find_secret_in_stream(fh: BinaryIO) -> Optional[str]:
    """find_secret over a whole stream of any size, in blocks that overlap by OVERLAP_BYTES. A block dense in NUL
    bytes is also read every 2nd and every 4th byte (each alignment): ASCII written as UTF-16 or UTF-32 without a
    BOM, or inside a binary, is seen as it reads."""
    tail = b""
    while True:
        block = fh.read(BLOCK_BYTES)
        if not block:
            return None
        data = tail + block
        what = find_secret(data) or _find_in_wide_text(data)
        if what:
            return what
        tail = data[-OVERLAP_BYTES:]


def _find_in_wide_text(data: bytes) -> Optional[str]:
    if data.count(0) * 8 < len(data):
        return None
    for stride in (2, 4):
        for offset in range(stride):
            what = find_secret(data[offset::stride], decode_base64=False)
            if what:
                return f"{what} (in {8 * stride}-bit text)"
    return None


def _strings(doc) -> Iterable[str]:
    """Every string of a decoded JSON document, keys included (iterative: nesting depth is the peer's choice)."""
    stack = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _secret_in_document(text: bytes) -> Optional[str]:
    import json

    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    joined = "\n".join(_strings(doc)).encode("utf-8", "surrogatepass")
    return find_secret_in_stream(io.BytesIO(joined))


def find_secret_in_json(fh: BinaryIO) -> Optional[str]:
    """find_secret over the decoded strings of a JSON document, or of each line of JSONL (lines that are not JSON
    are skipped: their raw bytes are scanned anyway)."""
    head = fh.read(JSON_WHOLE_BYTES + 1)
    if len(head) <= JSON_WHOLE_BYTES:
        what = _secret_in_document(head)
        if what:
            return what
        lines: Iterable[bytes] = head.split(b"\n")
    else:
        lines = _lines_after(head, fh)
    for line in lines:
        if line.strip():
            what = _secret_in_document(line)
            if what:
                return what
    return None


def _lines_after(head: bytes, fh: BinaryIO) -> Iterable[bytes]:
    """The lines of `head` followed by the rest of `fh`, one line at a time."""
    pending = head
    while True:
        *whole, pending = pending.split(b"\n")
        yield from whole
        more = fh.read(BLOCK_BYTES)
        if not more:
            yield pending
            return
        pending += more


def _is_json_like(name: str, first: bytes) -> bool:
    return name.lower().endswith(JSON_SUFFIXES) or first.lstrip()[:1] in (b"{", b"[")


# -- text encodings other than UTF-8 ---------------------------------------------------------------------------------

_BOMS = ((b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe", "utf-16-le"),
         (b"\xfe\xff", "utf-16-be"))


def text_encoding(head: bytes) -> Optional[str]:
    """UTF-16 or UTF-32 (LE/BE) when `head` (a file's first bytes) is text in one, by its BOM or, without one, by
    where its NUL bytes fall (ASCII in UTF-16 LE is `x\\0x\\0...`); None for anything else (UTF-8 included)."""
    for bom, encoding in _BOMS:
        if head.startswith(bom):
            return encoding
    sample = head[: len(head) - len(head) % 4]
    if len(sample) < 8:
        return None

    def zeros(stride: int, offset: int) -> float:
        part = sample[offset::stride]
        return part.count(0) / len(part)

    if min(zeros(4, 1), zeros(4, 2), zeros(4, 3)) > 0.9 and zeros(4, 0) < 0.5:
        return "utf-32-le"
    if min(zeros(4, 0), zeros(4, 1), zeros(4, 2)) > 0.9 and zeros(4, 3) < 0.5:
        return "utf-32-be"
    if zeros(2, 1) > 0.7 and zeros(2, 0) < 0.3:
        return "utf-16-le"
    if zeros(2, 0) > 0.7 and zeros(2, 1) < 0.3:
        return "utf-16-be"
    return None


class _Transcoded(io.RawIOBase):
    """A binary stream of UTF-16/32 text read back as UTF-8, block by block (undecodable units replaced)."""

    def __init__(self, fh: BinaryIO, encoding: str):
        import codecs

        self._fh, self._decoder, self._pending = fh, codecs.getincrementaldecoder(encoding)(errors="replace"), b""

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._pending) < size:
            raw = self._fh.read(BLOCK_BYTES)
            text = self._decoder.decode(raw, final=not raw)
            self._pending += text.encode("utf-8", "surrogatepass")
            if not raw:
                break
        if size < 0:
            out, self._pending = self._pending, b""
        else:
            out, self._pending = self._pending[:size], self._pending[size:]
        return out


# -- compressed and archived content ---------------------------------------------------------------------------------

# What is looked inside, judged by the first bytes, whatever the name: a `.gz`, a `.tar.gz`, a wheel, a zip, a tar.
GZIP_MAGIC, BZIP2_MAGIC, XZ_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd"
MAX_NESTING = 6  # containers inside containers (a wheel > a .tar.gz > its tar > a member is 3)
# Decompressed bytes one file of the tree may expand to, all its nested members together: beyond it the file is
# refused (it cannot be scanned whole). A compression bomb is stopped early by the ratio: past MIN_EXPANDED_BYTES,
# no container may expand to more than MAX_RATIO times its own size (text compresses about 5-10x).
MAX_EXPANDED_BYTES = 1 << 30
MIN_EXPANDED_BYTES = 64 << 20
MAX_RATIO = 100
SPOOL_IN_MEMORY = 8 << 20


def _container(head: bytes) -> Optional[str]:
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(BZIP2_MAGIC) and head[3:4].isdigit():
        return "bzip2"
    if head.startswith(XZ_MAGIC):
        return "xz"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if len(head) >= 262 and head[257:262] == b"ustar":
        return "tar"
    return None


class _Budget:
    """The decompressed bytes left to one file of the tree."""

    def __init__(self, display: str):
        self.display, self.left = display, MAX_EXPANDED_BYTES


def _spool(src: BinaryIO, budget: _Budget, limit: int, what: str):
    """`src` copied into a seekable temporary file (memory, then disk), within the budget and `limit`."""
    import tempfile

    out = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
    copied = 0
    while True:
        chunk = src.read(BLOCK_BYTES)
        if not chunk:
            break
        copied += len(chunk)
        budget.left -= len(chunk)
        if copied > limit or budget.left < 0:
            out.close()
            raise CredentialError(
                f"refusing to bundle {budget.display}: {what} expands past "
                f"{min(limit, MAX_EXPANDED_BYTES) // 2**20} MiB (a compression bomb?), so it cannot be checked for "
                "credentials", "ship it uncompressed, or leave it out")
        out.write(chunk)
    out.seek(0)
    return out


def _expand_limit(packed: int) -> int:
    return max(MIN_EXPANDED_BYTES, MAX_RATIO * packed)


def _scan_content(open_fh, name: str, display: str, depth: int = 0, budget: Optional[_Budget] = None,
                  size: Optional[int] = None) -> None:
    """One file or member: a compressed file's or an archive's members first (by name and content: their names say
    more), then its raw bytes, then (UTF-16/32 text) the same read as UTF-8, then (JSON content) its decoded
    strings; `open_fh()` opens it afresh for each pass."""
    budget = budget or _Budget(display)
    with open_fh() as fh:
        head = fh.read(4096)
    kind = _container(head)
    if kind is not None:
        _scan_container(open_fh, kind, name, display, depth, budget, size)
    with open_fh() as fh:
        what = find_secret_in_stream(fh)
    if what:
        raise _refuse(display, f"contains what looks like {what}")
    encoding = None if kind is not None else text_encoding(head)
    if encoding:
        with open_fh() as fh:
            what = find_secret_in_stream(_Transcoded(fh, encoding))
        if what:
            raise _refuse(display, f"contains what looks like {what} (in {encoding.upper()} text)")
        with open_fh() as fh:
            head = _Transcoded(fh, encoding).read(256)
    if kind is None and _is_json_like(name, head[:256]):
        with open_fh() as fh:
            what = find_secret_in_json(_Transcoded(fh, encoding) if encoding else fh)
        if what:
            raise _refuse(display, f"contains what looks like {what} in a JSON string")


def _scan_container(open_fh, kind: str, name: str, display: str, depth: int, budget: _Budget,
                    size: Optional[int]) -> None:
    if depth >= MAX_NESTING:
        raise CredentialError(f"refusing to bundle {redacted(budget.display)}: {redacted(display)} is nested {depth} "
                              "archives or compressions deep, too deep to check for credentials", "ship it less nested")
    if kind == "zstd":
        raise CredentialError(f"refusing to bundle {redacted(budget.display)}: {redacted(display)} is zstd-compressed, "
                              "which soarpack cannot open to check for credentials",
                              "ship it uncompressed or gzip-compressed")
    if size is None:
        with open_fh() as fh:
            size = fh.seek(0, io.SEEK_END)
    try:
        if kind in ("gzip", "bzip2", "xz"):
            import bz2
            import gzip
            import lzma

            opener = {"gzip": lambda fh: gzip.GzipFile(fileobj=fh, mode="rb"), "bzip2": bz2.BZ2File,
                      "xz": lzma.LZMAFile}[kind]
            base = name.rsplit("/", 1)[-1]
            inner = re.sub(r"\.(gz|tgz|bz2|xz|txz)$", lambda m: ".tar" if m.group(1) in ("tgz", "txz") else "", base)
            inner = inner if inner != base else f"{base} ({kind}-decompressed)"
            where = f"{display}!{inner}"
            with open_fh() as fh, opener(fh) as unpacked, _spool(unpacked, budget, _expand_limit(size), where) as spooled:
                _scan_member(spooled, inner, where, depth + 1, budget)
        elif kind == "zip":
            with open_fh() as fh, zipfile.ZipFile(fh) as zf:
                _scan_archive(zf, display, depth + 1, budget)
        elif kind == "tar":
            import tarfile

            with open_fh() as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
                for member in tar:
                    where = f"{display}!{member.name}"
                    problem = name_problem(member.name)
                    if problem:
                        raise _refuse(where, problem)
                    if member.isreg():
                        with tar.extractfile(member) as src, _spool(src, budget, _expand_limit(size), where) as spooled:
                            _scan_member(spooled, member.name, where, depth + 1, budget)
    except CredentialError:
        raise
    except (OSError, EOFError, ValueError, zipfile.BadZipFile, *_archive_errors()) as exc:
        raise CredentialError(f"cannot open the archive {redacted(display)} ({kind}) to scan it for credentials ({exc})",
                              "ship only archives and compressed files that open cleanly") from None


def _archive_errors() -> tuple:
    import lzma
    import tarfile
    import zlib

    return (tarfile.TarError, lzma.LZMAError, zlib.error)


def _scan_member(spooled, name: str, display: str, depth: int, budget: _Budget) -> None:
    """_scan_content over a spooled (seekable) member: each pass reads it again from its start."""
    import contextlib

    @contextlib.contextmanager
    def rewound():
        spooled.seek(0)
        yield spooled

    size = spooled.seek(0, io.SEEK_END)
    _scan_content(rewound, name, display, depth, budget, size)


def name_problem(rel: str | Path) -> Optional[str]:
    """Why a path's name alone marks it as a credential, or None: a credential's file name, or a token in it."""
    parts = Path(rel).parts
    for i, part in enumerate(parts):
        for name in {part, _PACKED_PREFIX.sub("", part)}:
            if name in FORBIDDEN_NAMES:
                return f"is or sits in '{name}', which holds credentials"
            if name.endswith(FORBIDDEN_SUFFIXES):
                return "has a key/certificate file extension"
            if i > 0 and name in FORBIDDEN_IN_FOLDER.get(parts[i - 1], ()):
                return f"is a {parts[i - 1]} login token file"
    what = find_secret(str(rel).encode("utf-8", "surrogateescape"))
    if what:
        return f"has a name that holds what looks like {what}"
    return None


def redacted(rel: str) -> str:
    """A path with every token-looking run in it cut to its first characters: a refusal must not print the secret."""
    out = str(rel)
    for _, pattern in SECRET_PATTERNS:
        regex = pattern.pattern if isinstance(pattern, _Token) else pattern
        out = regex.sub(lambda m: m.group()[:6] + b"...(redacted)", out.encode("utf-8", "surrogateescape")
                        ).decode("utf-8", "surrogateescape")
    return out


@functools.lru_cache(maxsize=1)
def locked_wheel_digests() -> FrozenSet[str]:
    """sha256 of every published wheel pinned in the platform lock."""
    from soarpack.bundle.wheels import load_lock

    return frozenset(w.sha256 for w in load_lock() if w.sha256)


def _is_locked_wheel(path: Path) -> bool:
    from soarpack.placement.content import sha256_file

    return path.name.endswith(".whl") and sha256_file(path) in locked_wheel_digests()


def _scan_archive(zf: zipfile.ZipFile, display: str, depth: int, budget: Optional[_Budget] = None) -> None:
    budget = budget or _Budget(display)
    for info in zf.infolist():
        member = f"{display}!{info.filename}"
        problem = name_problem(info.filename)
        if problem:
            raise _refuse(member, problem)
        if info.is_dir():
            continue
        with zf.open(info) as src, _spool(src, budget, _expand_limit(info.compress_size), member) as spooled:
            _scan_member(spooled, info.filename, member, depth, budget)


def scan_file(path: str | Path, display: Optional[str] = None) -> None:
    """Raise CredentialError if one file (named `display` in the message) looks like, or holds, a credential."""
    path = Path(path)
    display = display or str(path)
    problem = name_problem(display) or name_problem(path.name)
    if problem:
        raise _refuse(display, problem)
    if path.is_symlink() or not path.is_file() or _is_locked_wheel(path):
        return
    _scan_content(lambda: open(path, "rb"), path.name, display)


def check_input_names(paths: Iterable[str | Path]) -> None:
    """Refuse a user-supplied file by its own name (and its link target's) before it is renamed into the bundle;
    its content is scanned in the bundle tree."""
    for path in paths:
        path = Path(path)
        for name in (path.name, path.resolve().name):
            problem = name_problem(name)
            if problem:
                raise _refuse(str(path), problem)


def scan_tree(root: str | Path) -> None:
    """Raise CredentialError naming the first file (sorted order) that looks like a credential.

    The one decision on a bundle tree: `build` calls it on the finished tree (MANIFEST.json written) and `check` on
    the extracted upload, so build refuses exactly what check would."""
    root = Path(root)
    paths = sorted(root.rglob("*"), key=lambda p: p.as_posix())
    for path in paths:  # names first: MANIFEST.json repeats every name, and the file itself is the one to name
        rel = path.relative_to(root).as_posix()
        problem = name_problem(rel)
        if problem:
            raise _refuse(rel, problem)
    for path in paths:
        if path.is_file():
            scan_file(path, path.relative_to(root).as_posix())
