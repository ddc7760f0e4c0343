"""`soarpack speedset`: synthesize `{question, model_response}` rows that follow the published length mix.

The platform's speed set is hidden; only its length mix is published (SALA.md §2). Rows are cut from a token
pool (built-in prose or the user's text, sentences reshuffled with the seed) to a target token count drawn
uniformly inside each bucket; bucket counts follow the shares exactly (largest remainder), input and output
buckets are paired at random. Lengths are counted with the same tokenizer the bench uses.
"""

from __future__ import annotations

import bisect
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from soarpack import _toml
from soarpack.errors import ConfigError, InputDataError
from soarpack.inputs import MAX_TEXT_BYTES, MAX_TOML_BYTES, read_text_capped

K = 1024


@dataclass(frozen=True)
class Bucket:
    lo: int  # exclusive lower bound, in tokens
    hi: int  # inclusive upper bound
    share: float


# Published mix: input 0–4K 25%, 4–16K 10%, 16–32K 15%, 32–128K 35%, 128–160K 15%;
# output 0–512 35%, 512–2K 25%, 2–4K 10%, 4–16K 15%, 16–32K 15%.
DEFAULT_MIX: Dict[str, Tuple[Bucket, ...]] = {
    "input": (Bucket(0, 4 * K, 0.25), Bucket(4 * K, 16 * K, 0.10), Bucket(16 * K, 32 * K, 0.15),
              Bucket(32 * K, 128 * K, 0.35), Bucket(128 * K, 160 * K, 0.15)),
    "output": (Bucket(0, 512, 0.35), Bucket(512, 2 * K, 0.25), Bucket(2 * K, 4 * K, 0.10),
               Bucket(4 * K, 16 * K, 0.15), Bucket(16 * K, 32 * K, 0.15)),
}
MIN_TOKENS = 4  # bench_serving drops rows under 2 tokens; keep a margin for re-tokenization drift

BUILTIN_TEXT = """\
The river town woke slowly, as it always did in late autumn. Fishermen dragged their boats onto the gravel and
argued about the weather while the bakery on the square sent warm air into the street. A clerk at the post office
sorted letters by hand, because the machine had been broken since spring and nobody had found the part. Children
crossed the old stone bridge on their way to school, counting the lamps and stopping at the seventh to look for
the heron that nested below it. In the library, a retired engineer read about tidal mills and took careful notes
in a small green notebook. The mayor walked the length of the harbour wall to inspect the repairs, and found that
the new mortar had set well despite the rain. By noon the market was full: apples from the northern orchards,
smoked fish, wool, copper pots, and a stall that sold nothing but maps of places that no longer existed. A
traveller asked for directions to the observatory on the hill, and three people gave three different answers.
In the afternoon the wind turned west and the clouds broke, so the teacher took her class outside to measure the
shadows of the church tower and estimate its height. The estimate was wrong by only two metres, which pleased
everyone except the boy who had insisted the tower was taller than the lighthouse. At dusk the ferry sounded its
horn twice, the lamps on the bridge were lit one after another, and the town settled into the long evening.
"""


def load_mix(path: Optional[Path]) -> Dict[str, Tuple[Bucket, ...]]:
    """The default mix, or one from a TOML/JSON file: `[[input]] min=… max=… share=…` and `[[output]]` likewise."""
    if path is None:
        return DEFAULT_MIX
    path = Path(path)
    try:
        text = read_text_capped(path, "mix file", MAX_TOML_BYTES)
        raw = json.loads(text) if path.suffix == ".json" else _toml.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"mix file {path} does not exist", "check the path") from None
    except (json.JSONDecodeError, _toml.TOMLDecodeError) as exc:
        raise ConfigError(f"mix file {path} cannot be parsed ({exc})", "see `soarpack speedset --help` for the format") from None
    mix = {}
    for side in ("input", "output"):
        entries = raw.get(side)
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"mix file {path} has no [[{side}]] buckets", "give min, max and share for each bucket")
        try:
            buckets = tuple(Bucket(int(e["min"]), int(e["max"]), float(e["share"])) for e in entries)
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"mix file {path}: every {side} bucket needs integer min, max and a share", "fix the file") from None
        total = sum(b.share for b in buckets)
        if any(b.hi <= b.lo or b.hi < MIN_TOKENS or b.share < 0 for b in buckets) or abs(total - 1.0) > 0.01:
            raise ConfigError(f"mix file {path}: {side} buckets need max > min and shares summing to 1 (got {total:.3f})",
                              "fix the file")
        mix[side] = tuple(Bucket(b.lo, b.hi, b.share / total) for b in buckets)
    return mix


def allocate(n: int, buckets: Sequence[Bucket]) -> List[int]:
    """Row counts per bucket summing to n, as close to the shares as integers allow (largest remainder)."""
    exact = [n * b.share for b in buckets]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(buckets)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def target_lengths(n: int, buckets: Sequence[Bucket], rng: random.Random) -> List[int]:
    lengths = []
    for bucket, count in zip(buckets, allocate(n, buckets)):
        lo = max(bucket.lo + 1, MIN_TOKENS)
        lengths += [rng.randint(lo, bucket.hi) for _ in range(count)]
    rng.shuffle(lengths)
    return lengths


def sentences(text: str) -> List[str]:
    parts = [" ".join(s.split()) for s in re.split(r"(?<=[.!?。！？])\s+|\n{2,}", text)]
    return [s for s in parts if s]


class TokenPool:
    """A long token sequence made of reshuffled sentences, cut into texts of an exact token count.

    Cuts start at a sentence boundary where the tokenizer reports offsets (fast tokenizers do), so a prompt
    never opens mid-word; the length is then corrected by re-encoding, since decode → encode is not exact for
    BPE tokenizers at the cut points.
    """

    def __init__(self, tokenizer, text: str, need_tokens: int, rng: random.Random):
        self.tokenizer = tokenizer
        self.rng = rng
        units = sentences(text)
        if not units:
            raise InputDataError("the source text is empty", "pass a text file with some prose")
        self.slack = need_tokens // 8 + 256
        ids: List[int] = []
        starts: List[int] = []
        while len(ids) < need_tokens + 2 * self.slack:
            order = units[:]
            rng.shuffle(order)
            chunk = " ".join(order) + " "
            chunk_ids, chunk_starts = self._encode_with_sentence_starts(chunk, order)
            starts += [len(ids) + i for i in chunk_starts]
            ids += chunk_ids
        self.ids = ids
        self.starts = starts

    def _encode_with_sentence_starts(self, chunk: str, order: List[str]) -> Tuple[List[int], List[int]]:
        try:
            enc = self.tokenizer(chunk, add_special_tokens=False, return_offsets_mapping=True)
        except (NotImplementedError, TypeError, ValueError):  # slow tokenizers: no offsets, no boundaries
            return self.tokenizer.encode(chunk, add_special_tokens=False), [0]
        char_starts, pos = [], 0
        for sentence in order:
            char_starts.append(pos)
            pos += len(sentence) + 1
        token_starts, t = [], 0
        offsets = enc["offset_mapping"]
        for c in char_starts:
            while t < len(offsets) and offsets[t][1] <= c:
                t += 1
            if t < len(offsets):
                token_starts.append(t)
        return list(enc["input_ids"]), token_starts

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def text_of(self, target: int) -> Tuple[str, int]:
        """A text whose count (default special tokens included) is `target`, or the closest a few fixes got."""
        room = len(self.ids) - target - self.slack
        candidates = bisect.bisect_right(self.starts, room)
        start = self.starts[self.rng.randrange(candidates)] if candidates else self.rng.randrange(max(room, 1))
        take = target
        best = ("", -1)
        for _ in range(8):
            take = max(1, min(take, len(self.ids) - start))
            # A byte-level BPE glues the space before a sentence to its first token: drop it, then recount.
            text = self.tokenizer.decode(self.ids[start:start + take], skip_special_tokens=True).lstrip()
            got = self.count(text)
            if abs(got - target) < abs(best[1] - target):
                best = (text, got)
            if got == target:
                break
            take += target - got
        return best


@dataclass
class SpeedsetSummary:
    rows: int
    input_tokens: List[int]
    output_tokens: List[int]
    max_abs_error: int


def make_speedset(tokenizer, n: int, mix: Optional[Dict[str, Tuple[Bucket, ...]]] = None, seed: int = 1,
                  text: Optional[str] = None) -> Tuple[List[dict], SpeedsetSummary]:
    """n rows `{question, model_response}` with lengths drawn from `mix`; deterministic for a seed and tokenizer."""
    if n < 1:
        raise ConfigError("-n must be at least 1", "ask for one row or more")
    if text is not None and not text.strip():
        raise InputDataError("the text to cut rows from is empty", "give prose, or None for the built-in prose")
    mix = mix or DEFAULT_MIX
    rng = random.Random(seed)
    inputs = target_lengths(n, mix["input"], rng)
    outputs = target_lengths(n, mix["output"], rng)
    pool = TokenPool(tokenizer, BUILTIN_TEXT if text is None else text, max(inputs + outputs), rng)
    rows, got_in, got_out, worst = [], [], [], 0
    for want_in, want_out in zip(inputs, outputs):
        question, n_in = pool.text_of(want_in)
        response, n_out = pool.text_of(want_out)
        rows.append({"question": question, "model_response": response})
        got_in.append(n_in)
        got_out.append(n_out)
        worst = max(worst, abs(n_in - want_in), abs(n_out - want_out))
    return rows, SpeedsetSummary(len(rows), got_in, got_out, worst)


def bucket_histogram(lengths: Sequence[int], buckets: Sequence[Bucket]) -> List[int]:
    return [sum(1 for x in lengths if b.lo < x <= b.hi) for b in buckets]


def write_jsonl(path: Path, rows: List[dict]) -> Path:
    from soarpack.fsutil import atomic_write_text

    return atomic_write_text(path, jsonl_text(rows))


def jsonl_text(rows: List[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def speedset_text(path: Optional[Path]) -> Optional[str]:
    if path is None:
        return None
    try:
        text = read_text_capped(path, "text file", MAX_TEXT_BYTES)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputDataError(f"cannot read text file {path} ({exc.__class__.__name__})", "pass a UTF-8 text file") from None
    if not text.strip():
        raise InputDataError(f"text file {path} is empty", "pass a file with prose, or leave --text out for the built-in prose")
    return text

