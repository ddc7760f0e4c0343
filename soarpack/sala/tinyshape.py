"""The shape of a tiny model, checked before anything is made: every size within bounds, and the whole small
enough to write and quantize on a CPU (a huge one would end in a MemoryError, or abort the tokenizer trainer)."""

from __future__ import annotations

from typing import List, Optional

from soarpack.errors import ConfigError
from soarpack.sala.config import LIGHTNING, SPARSE

HEAD_DIM = 128
MAX_PARAMETERS = 1_000_000_000  # two bytes each in bfloat16: far past "tiny", still writable
BOUNDS = {"layers": (1, 256), "hidden": (1, 16384), "intermediate": (1, 64 * 1024), "heads": (1, 128),
          "kv_heads": (1, 128), "vocab": (300, 1_000_000)}  # vocab: 256 bytes + the tokenizer's merges


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def mixer_types(pattern: Optional[str]) -> Optional[List[str]]:
    """The layer kinds of `pattern` ("SLLS"), or None when no pattern is given."""
    if not pattern:
        return None
    kinds = {"S": SPARSE, "L": LIGHTNING}
    bad = sorted(set(pattern.upper()) - set(kinds))
    if bad:
        raise ConfigError(f"--pattern may hold only S and L, got {''.join(bad)!r}")
    return [kinds[c] for c in pattern.upper()]


def check_tiny_shape(**sizes: int) -> None:
    """Refuse a size out of its bounds (naming its flag), then a model too big as a whole."""
    for name, value in sizes.items():
        low, high = BOUNDS[name]
        if not low <= value <= high:
            raise ConfigError(f"{_flag(name)} {value} must be between {low} and {high} for a tiny model",
                              "the defaults make a model that quantizes on a CPU in seconds")
    hidden, layers = sizes["hidden"], sizes["layers"]
    per_layer = 4 * hidden * sizes["heads"] * HEAD_DIM + 3 * hidden * sizes["intermediate"]
    parameters = 2 * sizes["vocab"] * hidden + layers * per_layer
    if parameters > MAX_PARAMETERS:
        given = ", ".join(f"{_flag(name)} {value}" for name, value in sizes.items())
        raise ConfigError(f"{given} make about {parameters:.2g} parameters; a tiny model has at most "
                          f"{MAX_PARAMETERS:.0e}", "lower --layers, --hidden or --intermediate")
