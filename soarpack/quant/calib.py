"""Calibration data for GPTQ: read the user's files (or generate long-context-shaped prompts), tokenize, keep the
end of each prompt, and pick a seeded, task-stratified set of rows.

Accepted inputs, one example per JSONL line unless said otherwise:
  - SOAR rows `{"question": ..., "task": ..., "gold": ...}`: the question is rendered as one user turn with the
    model's chat template and generation prompt (what the server does for the eval); a string `gold` is appended
    as the start of the answer, so the answer tokens are calibrated too.
  - `{"text": ...}`: used as is.
  - `{"messages": [...]}`: rendered with the model's chat template.
  - any other file (`.txt`, `.md`): the whole file is one example.

Rows are truncated from the **left** (the question sits at the end of long prompts) to `max_len` tokens, which must
stay under the model's `dense_len` (8192): the sparse path above it is not what GPTQ should see.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

from soarpack.errors import ConfigError, InputDataError
from soarpack.inputs import MAX_CALIB_BYTES, check_input_path, iter_lines, read_text_capped
from soarpack.quant.options import CALIBRATION_DEFAULTS

MIN_ROW_TOKENS = 8
HELD_OUT_SEED_OFFSET = 1_000_003  # the built-in held-out prompts come from their own seed stream
BUILTIN_TASKS = ("niah", "kv", "cwe", "fwe", "mcq")


@dataclass(frozen=True)
class Example:
    """One calibration example before tokenization."""

    task: str
    text: Optional[str] = None  # used as is
    messages: Optional[List[Dict[str, str]]] = None  # rendered with the chat template
    answer: Optional[str] = None  # appended after the rendered prompt
    source: str = ""


@dataclass(frozen=True)
class CalibRow:
    task: str
    ids: List[int]
    truncated: bool


# -- reading ------------------------------------------------------------------------------------------------


# A text file holding more than this share of control characters (NULs of UTF-16, binary data) is refused.
MAX_CONTROL_SHARE = 0.01
_TEXT_CONTROLS = frozenset("\t\n\r\f\v")


def _check_string(value: Any, where: str, field: str) -> str:
    """A non-empty str that tokenizers can encode (no lone surrogate from a JSON `\\ud800` escape)."""
    if not isinstance(value, str) or not value:
        raise InputDataError(f"{where}: `{field}` must be a non-empty string, got {type(value).__name__}",
                             "fix or delete that row")
    if not value.strip():
        raise InputDataError(f"{where}: `{field}` is only whitespace", "fix or delete that row")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputDataError(f"{where}: `{field}` holds a lone surrogate ({value[exc.start]!a} at character {exc.start})",
                             "an escaped \\ud800-\\udfff needs its pair; fix or delete that row") from None
    return value


def _example_from_obj(obj: Any, where: str) -> Example:
    if not isinstance(obj, dict):
        raise InputDataError(f"{where}: expected a JSON object", 'each line is {"question": ...}, {"text": ...} or {"messages": [...]}')
    task = str(obj.get("task") or "text")
    if "question" in obj:
        q = _check_string(obj["question"], where, "question")
        gold = obj.get("gold")
        answer = _check_string(gold, where, "gold") if isinstance(gold, str) and gold.strip() else None
        return Example(task=str(obj.get("task") or "soar"), messages=[{"role": "user", "content": q}],
                       answer=answer, source=where)
    if "text" in obj:
        return Example(task=task, text=_check_string(obj["text"], where, "text"), source=where)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and "role" in m and "content" in m for m in msgs):
            raise InputDataError(f"{where}: `messages` must be a list of {{role, content}} objects")
        for i, m in enumerate(msgs):
            _check_string(m["role"], where, f"messages[{i}].role")
            _check_string(m["content"], where, f"messages[{i}].content")
        example = Example(task=str(obj.get("task") or "chat"), messages=msgs, source=where)
        check_renders(example)
        return example
    raise InputDataError(f"{where}: no `question`, `text` or `messages` field", "see `soarpack calib --help` for the formats")


def check_renders(example: Example) -> None:
    """Render a chat row through a template shaped like SALA's (as transformers renders it), so a row that would
    crash `apply_chat_template` at quantize time on the platform stops here, at build, with its file and line."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from soarpack.sala.chat import CHAT_TEMPLATE

    template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)
    try:
        template.render(messages=example.messages, add_generation_prompt=True)
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise InputDataError(f"{example.source}: the chat template cannot render this row ({exc.__class__.__name__}: {exc})",
                             "fix or delete that row") from None


def _check_looks_like_text(text: str, where: str) -> None:
    controls = sum(1 for ch in text if (ch < " " and ch not in _TEXT_CONTROLS) or ch in "\x7f\ufffd")
    if controls > MAX_CONTROL_SHARE * len(text):
        raise InputDataError(f"{where}: {controls} of {len(text)} characters are control or replacement characters; "
                             "this is not text", "pass a UTF-8 text or JSONL file")


JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")  # compared lower-cased: `.JSONL` is JSONL too


def _first_line_is_object(text: str) -> bool:
    """Content sniffing for a file without a JSONL suffix: its first non-blank line is a JSON object."""
    for line in text.split("\n"):
        if line.strip():
            try:
                return isinstance(json.loads(line), dict)
            except json.JSONDecodeError:
                return False
    return False


def is_jsonl(name: str, text: str) -> bool:
    """The one rule of what a calibration file is (read_examples, count_rows, calibinfo.file_rows): JSONL by its
    suffix in any case (`.jsonl`, `.json`, `.ndjson`) or by its content (the first non-blank line is a JSON
    object); any other file is one text row."""
    return Path(name).suffix.lower() in JSONL_SUFFIXES or _first_line_is_object(text)


def row_lines(name: str, text: str) -> List[str]:
    """The lines read_examples makes a row of each (lines end at "\n" only; blank lines are none); the whole text
    as one row for a text file (none when it is blank)."""
    if is_jsonl(name, text):
        return [line for line in text.split("\n") if line.strip()]
    return [text] if text.strip() else []


def count_rows(name: str, text: str) -> int:
    """How many examples read_examples makes of a file with this name and text (without validating them)."""
    return len(row_lines(name, text))


def _examples_from_lines(path: Path, lines: Iterable) -> List[Example]:
    out = []
    for lineno, line in lines:
        where = f"{path.name}:{lineno}"
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputDataError(f"{where}: not valid JSON ({exc.msg})", "one JSON object per line") from None
        out.append(_example_from_obj(obj, where))
    if not out:
        raise InputDataError(f"calibration file {path.name} holds no rows")
    return out


def _check_binary_chunk(chunk: str, path: Path) -> None:
    # A whole chunk (1 MiB) of control characters is binary data (/dev/zero): refused now, not at the size cap.
    if len(chunk) >= 2**16:
        _check_looks_like_text(chunk, str(path))


def read_examples(path: str | Path) -> List[Example]:
    """Examples of one file; a broken line (bad UTF-8, bad JSON, wrong types) stops with the file and line number.

    A file is JSONL by its suffix (`.jsonl`, `.json`, `.ndjson`, any case) or by its content (its first non-blank
    line is a JSON object); any other file is one text row. Lines end at "\\n" only, so a U+2028 or U+0085 inside a
    string stays in it. The file is read as a stream (a pipe such as /dev/fd/N is input) under a size cap."""
    path = Path(path)
    check_input_path(path, "calibration file")
    if is_jsonl(path.name, ""):  # by its suffix: read as a stream
        return _examples_from_lines(path, iter_lines(path, "calibration file", MAX_CALIB_BYTES))
    text = read_text_capped(path, "calibration file", MAX_CALIB_BYTES, check_chunk=lambda chunk: _check_binary_chunk(chunk, path))
    if is_jsonl(path.name, text):  # by its content
        return _examples_from_lines(path, enumerate(text.split("\n"), 1))
    if not text.strip():
        raise InputDataError(f"calibration file {path.name} is empty")
    _check_looks_like_text(text, path.name)
    return [Example(task="text", text=_check_string(text, path.name, "text"), source=path.name)]


# -- tokenization -------------------------------------------------------------------------------------------


def encode_example(ex: Example, tokenizer: Any) -> List[int]:
    if ex.messages is not None:
        if not getattr(tokenizer, "chat_template", None):
            if ex.answer is None and len(ex.messages) == 1:
                text = ex.messages[0]["content"]
                return list(tokenizer.encode(text))
            raise InputDataError(f"{ex.source}: chat rows need a chat template and the tokenizer has none",
                                 'use {"text": ...} rows or a model directory with a chat template')
        try:
            prompt = tokenizer.apply_chat_template(ex.messages, tokenize=False,
                                                   add_generation_prompt=ex.messages[-1]["role"] != "assistant")
        except Exception as exc:  # jinja's TemplateError, or whatever the template's own code raises
            raise InputDataError(f"{ex.source}: the model's chat template fails on this row "
                                 f"({exc.__class__.__name__}: {str(exc)[:200]})",
                                 "fix the chat_template in the model's tokenizer_config.json (or chat_template.jinja), "
                                 "or use {\"text\": ...} rows") from None
        if ex.answer:
            prompt += ex.answer
        # The template already holds the special tokens it wants.
        return list(tokenizer.encode(prompt, add_special_tokens=False))
    return list(tokenizer.encode(ex.text))


# -- selection ----------------------------------------------------------------------------------------------


def stratified_pick(examples: Sequence[Example], rows: int, seed: int) -> List[Example]:
    """Up to `rows` examples, round-robin over tasks (each task shuffled with the seed), so every task is fairly represented."""
    rng = random.Random(seed)
    by_task: Dict[str, List[Example]] = defaultdict(list)
    for ex in examples:
        by_task[ex.task].append(ex)
    pools = []
    for task in sorted(by_task):
        pool = list(by_task[task])
        rng.shuffle(pool)
        pools.append(pool)
    picked: List[Example] = []
    while len(picked) < rows and any(pools):
        for pool in pools:
            if pool and len(picked) < rows:
                picked.append(pool.pop())
    rng.shuffle(picked)
    return picked


def check_max_len(max_len: int, dense_len: Optional[int]) -> None:
    if max_len < MIN_ROW_TOKENS:
        raise ConfigError(f"--max-len {max_len} is too short", f"use at least {MIN_ROW_TOKENS} (2048-4096 is typical)")
    if dense_len and max_len >= dense_len:
        raise ConfigError(
            f"--max-len {max_len} reaches the model's dense_len {dense_len}: longer rows take the sparse path",
            f"use at most {dense_len - 1}",
        )


def builtin_max_words(max_len: int) -> int:
    """Words per built-in prompt for rows of `max_len` tokens: local runs and the bundle's shipped file alike."""
    return max(16, int(max_len * 0.9))


def build_calibration(paths: Optional[Iterable[str | Path]], tokenizer: Any, *, rows: int, max_len: int, seed: int,
                      dense_len: Optional[int] = None) -> List[CalibRow]:
    """Tokenized, left-truncated, task-stratified rows; the built-in generator when no paths are given."""
    check_max_len(max_len, dense_len)
    if rows < 1:
        raise ConfigError(f"--rows {rows} must be at least 1")
    paths = list(paths or [])
    if paths:
        examples = [ex for p in paths for ex in read_examples(p)]
    else:
        check_builtin_rows(rows, seed, max_len)
        examples = builtin_examples(rows, seed, max_words=builtin_max_words(max_len))
    out = []
    for ex in stratified_pick(examples, rows, seed):
        ids = encode_example(ex, tokenizer)
        if len(ids) < MIN_ROW_TOKENS:
            continue
        out.append(CalibRow(task=ex.task, ids=ids[-max_len:], truncated=len(ids) > max_len))
    if not out:
        raise InputDataError("no calibration row has enough tokens", f"rows need at least {MIN_ROW_TOKENS} tokens")
    return out


def load_calibration(paths: Optional[Iterable[str | Path]], tokenizer: Any, *, rows: int, max_len: int, seed: int,
                     dense_len: Optional[int] = None) -> List[List[int]]:
    """Rows of token ids (see build_calibration)."""
    return [r.ids for r in build_calibration(paths, tokenizer, rows=rows, max_len=max_len, seed=seed, dense_len=dense_len)]


def build_held_out(paths: Optional[Iterable[str | Path]], tokenizer: Any, *, rows: int, max_len: int, seed: int,
                   calibration: Sequence[CalibRow], dense_len: Optional[int] = None) -> List[CalibRow]:
    """Held-out rows for the sanity loss and the KL report: from their own files, or from the built-in generator's
    own seed stream; never a calibration row (a row found in both is refused)."""
    held = build_calibration(paths, tokenizer, rows=rows, max_len=max_len, seed=seed + HELD_OUT_SEED_OFFSET,
                             dense_len=dense_len)
    seen = {tuple(r.ids) for r in calibration}
    for k, row in enumerate(held):
        if tuple(row.ids) in seen:
            raise InputDataError(f"held-out row {k + 1} is also a calibration row",
                                 "held-out data must be disjoint from the calibration data")
    return held


def summarize(rows: Sequence[CalibRow], max_len: int) -> Dict[str, Any]:
    """Counts by task, a token-length histogram and the truncation count (for `soarpack calib`)."""
    edges = [0, 128, 256, 512, 1024, 2048, 4096, 8192]
    edges = [e for e in edges if e < max_len] + [max_len]
    hist = Counter()
    for r in rows:
        n = len(r.ids)
        for lo, hi in zip(edges, edges[1:]):
            if lo < n <= hi:
                hist[f"{lo + 1}-{hi}"] += 1
                break
    lengths = sorted(len(r.ids) for r in rows)
    return {
        "rows": len(rows),
        "tokens": sum(lengths),
        "tasks": dict(sorted(Counter(r.task for r in rows).items())),
        "length_histogram": {f"{lo + 1}-{hi}": hist.get(f"{lo + 1}-{hi}", 0) for lo, hi in zip(edges, edges[1:])},
        "min_len": lengths[0] if lengths else 0,
        "median_len": lengths[len(lengths) // 2] if lengths else 0,
        "max_len": lengths[-1] if lengths else 0,
        "truncated": sum(r.truncated for r in rows),
    }


# -- the built-in generator ---------------------------------------------------------------------------------

_WORDS = (
    "time year people way day man thing woman life child world school state family student group country problem "
    "hand part place case week company system program question work government number night point home water room "
    "mother area money story fact month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education river garden market window paper "
    "music letter color forest stone bridge island valley summer winter harbor engine signal marble lantern orbit "
    "velvet copper meadow canyon thunder crystal feather glacier horizon journal kettle ladder mirror needle orchard "
    "pepper quartz ribbon saddle tunnel umbrella violin walnut yellow zephyr anchor basket candle dolphin"
).split()
_SENT = ("The {a} near the {b} was {c} by the {d}.", "Every {a} keeps a {b} for the {c}.",
         "A {a} and a {b} walked past the {c} before the {d} arrived.", "Nobody expected the {a} to {v} the {b}.",
         "In the {a}, the {b} {v}s quietly while the {c} waits.")
_VERBS = "carry move paint follow open watch build count hold find".split()


def _filler(rng: random.Random, n_words: int) -> List[str]:
    out: List[str] = []
    words = 0
    while words < n_words:
        s = rng.choice(_SENT).format(a=rng.choice(_WORDS), b=rng.choice(_WORDS), c=rng.choice(_WORDS),
                                     d=rng.choice(_WORDS), v=rng.choice(_VERBS))
        out.append(s)
        words += len(s.split())
    return out


def _insert(sentences: List[str], rng: random.Random, item: str) -> None:
    sentences.insert(rng.randint(0, len(sentences)), item)


def _niah(rng, n):
    key, num = f"{rng.choice(_WORDS)}-{rng.choice(_WORDS)}", str(rng.randint(1000000, 9999999))
    text = _filler(rng, n)
    _insert(text, rng, f"One of the special magic numbers for {key} is: {num}.")
    q = (" ".join(text) + f"\n\nWhat is the special magic number for {key} mentioned in the provided text? "
         f"The special magic number for {key} mentioned in the provided text is")
    return q, num


def _kv(rng, n):
    pairs = {}
    while len(pairs) < max(4, n // 12):
        pairs["-".join(f"{rng.getrandbits(32):08x}" for _ in range(2))] = "-".join(f"{rng.getrandbits(32):08x}" for _ in range(2))
    key = rng.choice(list(pairs))
    q = ("JSON data:\n" + json.dumps(pairs, indent=0) + f"\n\nKey: \"{key}\"\nThe value associated with the "
         "specified key is:")
    return q, pairs[key]


def _cwe(rng, n):
    vocab = rng.sample(_WORDS, 40)
    common, rare = vocab[:10], vocab[10:]
    words = [w for w in common for _ in range(max(3, n // 40))] + [rng.choice(rare) for _ in range(max(10, n // 3))]
    rng.shuffle(words)
    listing = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words[:n]))
    q = (f"Below is a numbered list of words. In these words, some appear more often than others.\n{listing}\n"
         "Question: What are the 10 most common words in the above list? Answer: The top 10 words that appear most often in the list are:")
    return q, ", ".join(common)


def _fwe(rng, n):
    coded = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5)) for _ in range(20)]
    weights = [30, 20, 12] + [1] * 17
    text = " ".join(rng.choices(coded, weights=weights, k=max(20, n)))
    q = ("Read the following coded text and track the frequency of each coded word. Find the three most frequently "
         f"appeared coded words.\n{text}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
         "What are the three most frequently appeared words in the above coded text? Answer:")
    return q, ", ".join(coded[:3])


def _mcq(rng, n):
    passage = " ".join(_filler(rng, max(20, n - 40)))
    subject, truth = rng.choice(_WORDS), rng.choice(_WORDS)
    options = rng.sample([w for w in _WORDS if w != truth], 3) + [truth]
    rng.shuffle(options)
    letter = "ABCD"[options.index(truth)]
    q = (f"{passage}\nIn this story the {subject} is kept beside the {truth}.\n\nQuestion: What is the {subject} kept "
         "beside?\n" + "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(options))
         + "\n\nThink step by step, then finish with a line of the form 'ANSWER: X' where X is one of A, B, C, D.")
    return q, f"The story says the {subject} is kept beside the {truth}.\nANSWER: {letter}"


_GENERATORS = {"niah": _niah, "kv": _kv, "cwe": _cwe, "fwe": _fwe, "mcq": _mcq}


def iter_builtin_prompts(n: int, seed: int = 0, *, max_words: int = 3000) -> Iterator[Dict[str, str]]:
    """builtin_prompts one row at a time (the same rows, in the same order, for the same arguments)."""
    rng = random.Random(seed)
    for k in range(n):
        task = BUILTIN_TASKS[k % len(BUILTIN_TASKS)]
        words = int(round(48 * (max(max_words, 49) / 48) ** rng.random()))
        q, gold = _GENERATORS[task](rng, words)
        yield {"task": task, "question": q, "gold": gold}


def builtin_prompts(n: int, seed: int = 0, *, max_words: int = 3000) -> List[Dict[str, str]]:
    """`n` SOAR-format rows (`question`, `task`, `gold`): needle retrieval, key-value lookup, common and frequent
    word extraction, multiple choice; lengths log-uniform between ~48 and `max_words` words."""
    return list(iter_builtin_prompts(n, seed, max_words=max_words))


# -- how many built-in rows can be: a bundle ships them as one file, and quantize reads one calibration file up to
# MAX_CALIB_BYTES; a local run is held to the same, so that what runs here can be shipped.

# Every built-in row is longer than this as a JSONL line (the shortest measured: 342 bytes; tests check the floor).
MIN_BUILTIN_ROW_BYTES = 256
SIZE_SAMPLE_ROWS = 256  # rows generated up front to estimate the size of a large ask
SIZE_MARGIN = 1.5  # an estimate this far over the cap is refused before generating; nearer, the cap decides


def max_builtin_rows() -> int:
    """No more built-in rows than this fit in one calibration file, whatever their lengths."""
    return MAX_CALIB_BYTES // MIN_BUILTIN_ROW_BYTES


def _too_many(n: int, why: str, asked: str) -> ConfigError:
    return ConfigError(f"{n} calibration rows ({asked}) of the built-in prompts would not fit in one calibration "
                       f"file: {why}", "ask for fewer rows, or pass calibration files of your own (--calib)")


def check_builtin_rows(n: int, seed: int, max_len: int, asked: str = "--rows") -> None:
    """Refuse, before generating them, `n` built-in rows that cannot fit in one calibration file of
    MAX_CALIB_BYTES (what quantize reads): more rows than the file holds at the shortest row, or a size the first
    rows' mean size puts far over it. A count near the cap is decided by the cap itself, as the rows are written."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"{asked} {n!r} is not a row count", "ask for 1 row or more")
    cap = MAX_CALIB_BYTES
    if n > max_builtin_rows():
        raise _too_many(n, f"the file holds at most {max_builtin_rows()} ({cap // 2**20} MiB, what quantize reads, "
                           f"at {MIN_BUILTIN_ROW_BYTES} bytes or more a row)", asked)
    sample = min(n, SIZE_SAMPLE_ROWS)
    if sample == n:
        return
    sizes = [len(_jsonl_line(row)) for row in iter_builtin_prompts(sample, seed, max_words=builtin_max_words(max_len))]
    estimate = sum(sizes) / sample * n
    if estimate > SIZE_MARGIN * cap:
        raise _too_many(n, f"at --max-len {max_len} they would take about {estimate / 2**20:.0f} MiB, over the "
                           f"{cap // 2**20} MiB quantize reads of one file", asked)


def _jsonl_line(row: Dict[str, str]) -> str:
    return json.dumps(row, ensure_ascii=False) + "\n"


def _capped_builtin(n: int, seed: int, max_words: int, asked: str = "--rows") -> Iterator[tuple]:
    """(row, its JSONL line) for the built-in rows, stopping with a ConfigError as soon as the lines pass the
    calibration file cap: the cost of a too-large ask is bounded by the cap, not by the ask."""
    total = 0
    for row in iter_builtin_prompts(n, seed, max_words=max_words):
        line = _jsonl_line(row)
        total += len(line.encode("utf-8"))
        if total > MAX_CALIB_BYTES:
            raise _too_many(n, f"they pass the {MAX_CALIB_BYTES // 2**20} MiB quantize reads of one file", asked)
        yield row, line


def builtin_examples(n: int, seed: int = 0, *, max_words: int = 3000) -> List[Example]:
    return [_example_from_obj(row, f"builtin:{k}") for k, (row, _) in enumerate(_capped_builtin(n, seed, max_words))]


def write_builtin_calibration(path: str | Path, n: int, seed: int, max_len: int = CALIBRATION_DEFAULTS.max_len, *,
                              held_out: bool = False, asked: str = "--rows") -> Path:
    """Write the built-in prompts as a SOAR-format JSONL (what a bundle ships): exactly the rows a local run with
    the same settings generates; `held_out` writes the held-out stream instead. `asked`: who asked for `n` rows,
    as a refusal names it."""
    from soarpack.placement.write import atomic_write_text

    return atomic_write_text(path, builtin_calibration_text(n, seed, max_len, held_out=held_out, asked=asked))


def builtin_calibration_text(n: int, seed: int, max_len: int = CALIBRATION_DEFAULTS.max_len, *,
                             held_out: bool = False, asked: str = "--rows") -> str:
    """The JSONL that write_builtin_calibration writes (refused, with ConfigError, when it could not fit in one
    calibration file: check_builtin_rows up front, the cap as it is written)."""
    seed = seed + HELD_OUT_SEED_OFFSET if held_out else seed
    check_builtin_rows(n, seed, max_len, asked)
    return "".join(line for _, line in _capped_builtin(n, seed, builtin_max_words(max_len), asked))
