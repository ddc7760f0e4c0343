"""`soarpack speedset`: synthesize `{question, model_response}` rows that follow a length mix.

The platform's speed set is hidden; only its length mix is published (SALA.md §2). Rows are cut from a token
pool (built-in prose or the user's text, sentences reshuffled with the seed) to a target token count drawn
uniformly inside each bucket, then cut to the mix's caps if it has any; bucket counts follow the shares exactly
(largest remainder), input and output buckets are paired at random. Lengths are counted with the same tokenizer
the bench uses. Named mixes (`PRESETS`) say where their shares come from.
"""

from __future__ import annotations

import bisect
import json
import random
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from soarpack import _toml
from soarpack.errors import ConfigError, InputDataError
from soarpack.inputs import MAX_TEXT_BYTES, MAX_TOML_BYTES, read_text_capped

K = 1024


@dataclass(frozen=True)
class Bucket:
    lo: int  # exclusive lower bound, in tokens
    hi: int  # inclusive upper bound
    share: float


@dataclass(frozen=True)
class Mix:
    """Input and output buckets, optional caps on the drawn lengths, and where the shares come from.

    `mix["input"]` / `mix["output"]` give the buckets, as the plain dict form of a mix does."""

    input: Tuple[Bucket, ...]
    output: Tuple[Bucket, ...]
    input_cap: Optional[int] = None  # every drawn input length above it is cut to it
    output_cap: Optional[int] = None
    name: str = "custom"
    source: str = "a mix file"

    def __getitem__(self, side: str) -> Tuple[Bucket, ...]:
        if side not in ("input", "output"):
            raise KeyError(side)
        return getattr(self, side)

    def cap(self, side: str) -> Optional[int]:
        return self.input_cap if side == "input" else self.output_cap

    def describe(self) -> Dict[str, object]:
        return {"name": self.name, "source": self.source, "input_cap": self.input_cap, "output_cap": self.output_cap}


MixLike = Union[Mix, Mapping[str, Tuple[Bucket, ...]]]

# Published mix: input 0–4K 25%, 4–16K 10%, 16–32K 15%, 32–128K 35%, 128–160K 15%;
# output 0–512 35%, 512–2K 25%, 2–4K 10%, 4–16K 15%, 16–32K 15%.
DEFAULT_MIX = Mix(
    input=(Bucket(0, 4 * K, 0.25), Bucket(4 * K, 16 * K, 0.10), Bucket(16 * K, 32 * K, 0.15),
           Bucket(32 * K, 128 * K, 0.35), Bucket(128 * K, 160 * K, 0.15)),
    output=(Bucket(0, 512, 0.35), Bucket(512, 2 * K, 0.25), Bucket(2 * K, 4 * K, 0.10),
            Bucket(4 * K, 16 * K, 0.15), Bucket(16 * K, 32 * K, 0.15)),
    name="published",
    source="the competition's published length mix (SALA.md §2). On 2026-04-15 the official set was replaced by a "
           "longer hidden one, 68% of inputs in 32K-512K tokens, whose shares are not published: this mix is shorter "
           "than what the platform now runs",
)


def scaled(mix: Mix, divisor: int, name: str, source: str) -> Mix:
    """Every bucket bound of `mix` divided by `divisor`, the shares kept."""
    def side(buckets):
        return tuple(Bucket(b.lo // divisor, b.hi // divisor, b.share) for b in buckets)
    return Mix(side(mix.input), side(mix.output), name=name, source=source)


PRESETS: Dict[str, Mix] = {
    "published": DEFAULT_MIX,
    "long-128k": replace(
        DEFAULT_MIX, input_cap=128 * K, output_cap=256, name="long-128k",
        source="the published shares (SALA.md §2) with every input above 128K tokens cut to 128K and every output to "
               "256 tokens: prompts at the platform's lengths that one H200 lease can serve; prefill-bound, so it "
               "under-weights decode"),
    "1of16": scaled(DEFAULT_MIX, 16, "1of16",
                    "the published shares with every bound divided by 16 (inputs to 10K tokens, outputs to 2K): the mix "
                    "of soarpack's first served runs (benchmarks/RESULTS.md §8); far shorter than the platform's"),
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


def as_mix(mix: Optional[MixLike]) -> Mix:
    """A Mix from a Mix, the plain `{"input": buckets, "output": buckets}` form, or None (the published mix)."""
    if mix is None:
        return DEFAULT_MIX
    if isinstance(mix, Mix):
        return mix
    return Mix(tuple(mix["input"]), tuple(mix["output"]))


def preset_help() -> str:
    return "; ".join(f"{name}: {mix.source}" for name, mix in PRESETS.items())


def load_mix(spec: Union[str, Path, None]) -> Mix:
    """The published mix (None), a preset by name (`PRESETS`), or a mix file (TOML/JSON): `[[input]] min=… max=…
    share=…`, `[[output]]` likewise, and optional top-level `input_cap` / `output_cap`."""
    if spec is None:
        return DEFAULT_MIX
    if isinstance(spec, str) and spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.exists() and path.suffix not in (".toml", ".json") and "/" not in str(spec):
        raise ConfigError(f"--mix {spec}: no such preset or file",
                          f"name a preset ({', '.join(PRESETS)}) or a TOML/JSON mix file")
    try:
        text = read_text_capped(path, "mix file", MAX_TOML_BYTES)
        raw = json.loads(text) if path.suffix == ".json" else _toml.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"mix file {path} does not exist", f"check the path, or name a preset ({', '.join(PRESETS)})") from None
    except (json.JSONDecodeError, _toml.TOMLDecodeError) as exc:
        raise ConfigError(f"mix file {path} cannot be parsed ({exc})", "see `soarpack speedset --help` for the format") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"mix file {path} is not a table of [[input]] and [[output]] buckets", "fix the file")
    sides = {}
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
        sides[side] = tuple(Bucket(b.lo, b.hi, b.share / total) for b in buckets)
    caps = {}
    for key in ("input_cap", "output_cap"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < MIN_TOKENS):
            raise ConfigError(f"mix file {path}: {key} must be a whole number of tokens, at least {MIN_TOKENS}",
                              "fix the file, or leave it out for no cap")
        caps[key] = value
    return Mix(sides["input"], sides["output"], name=path.name, source=f"mix file {path}", **caps)


def allocate(n: int, buckets: Sequence[Bucket]) -> List[int]:
    """Row counts per bucket summing to n, as close to the shares as integers allow (largest remainder)."""
    exact = [n * b.share for b in buckets]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(buckets)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def target_lengths(n: int, buckets: Sequence[Bucket], rng: random.Random, cap: Optional[int] = None) -> List[int]:
    lengths = []
    for bucket, count in zip(buckets, allocate(n, buckets)):
        lo = max(bucket.lo + 1, MIN_TOKENS)
        lengths += [rng.randint(lo, bucket.hi) for _ in range(count)]
    rng.shuffle(lengths)
    # The cap comes after the draw, so a capped mix pairs and orders its rows exactly as the uncapped one.
    return lengths if cap is None else [min(length, cap) for length in lengths]


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


def make_speedset(tokenizer, n: int, mix: Optional[MixLike] = None, seed: int = 1,
                  text: Optional[str] = None) -> Tuple[List[dict], SpeedsetSummary]:
    """n rows `{question, model_response}` with lengths drawn from `mix` (default: the published mix);
    deterministic for a seed and tokenizer."""
    if n < 1:
        raise ConfigError("-n must be at least 1", "ask for one row or more")
    if text is not None and not text.strip():
        raise InputDataError("the text to cut rows from is empty", "give prose, or None for the built-in prose")
    mix = as_mix(mix)
    rng = random.Random(seed)
    inputs = target_lengths(n, mix.input, rng, mix.input_cap)
    outputs = target_lengths(n, mix.output, rng, mix.output_cap)
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
    from soarpack.placement.write import atomic_write_text

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

