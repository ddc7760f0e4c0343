"""The released MiniCPM-SALA's shape (SALA.md §3), for full-size synthetic runs and checks against the real config."""

from __future__ import annotations

from soarpack.sala.config import LIGHTNING, SPARSE
from soarpack.sala.tiny import tiny_config_dict

RELEASE_SPARSE_LAYERS = (0, 9, 16, 17, 22, 29, 30, 31)
RELEASE_NUM_LAYERS = 32


def release_config_dict() -> dict:
    """config.json of openbmb/MiniCPM-SALA as far as soarpack reads it (every field the fork reads too)."""
    mixers = [SPARSE if i in RELEASE_SPARSE_LAYERS else LIGHTNING for i in range(RELEASE_NUM_LAYERS)]
    cfg = tiny_config_dict(
        mixer_types=mixers,
        hidden_size=4096,
        intermediate_size=16384,
        num_attention_heads=32,
        num_key_value_heads=2,
        head_dim=128,
        lightning_nh=32,
        lightning_head_dim=128,
        vocab_size=73448,
        eos_token_ids=(2, 73440),
    )
    return cfg
