"""A tiny random MiniCPM-SALA checkpoint in the exact Hugging Face layout, for tests and the demo.

It has every file the real release has: `config.json` with every real field (and `auto_map` naming the remote-code
files, written here as placeholders that say so), `generation_config.json`, a byte-level BPE tokenizer trained at
generation time with a chat template shaped like the real one, and sharded safetensors with an index.
Deterministic for a seed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from soarpack.errors import ConfigError
from soarpack.placement.write import atomic_dir
from soarpack.sala.chat import CHAT_TEMPLATE
from soarpack.sala.config import LIGHTNING, SPARSE, SalaConfig
from soarpack.sala.checkpoint import save_state_dict

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|fim_pad|>"]

REMOTE_CODE_PLACEHOLDER = '''"""PLACEHOLDER written by `soarpack tiny-model`: not MiniCPM-SALA's remote code.

The real release ships {name} here. This tiny test checkpoint names it in config.json's auto_map so that tools
see the real layout; soarpack never imports it. Importing it raises.
"""

raise ImportError("placeholder remote-code module written by soarpack tiny-model; use soarpack.sala instead")
'''

_WORDS = (
    "the model reads long documents and answers questions about needles keys values passages and numbers "
    "quantization keeps weights small while attention over sparse blocks and linear states keeps decoding fast "
    "a lightning layer carries a recurrent state while a sparse layer attends to selected blocks of the past "
    "answer with the letter of the correct option think step by step then give the final answer in a box "
    "apple river mountain seven orange window garden silver yellow thunder castle forest ocean planet"
).split()


def tiny_config_dict(
    num_layers: int = 4,
    mixer_types: Optional[Sequence[str]] = None,
    hidden_size: int = 256,
    intermediate_size: int = 640,
    num_attention_heads: int = 2,
    num_key_value_heads: int = 1,
    head_dim: int = 128,
    lightning_nh: int = 2,
    lightning_head_dim: int = 128,
    vocab_size: int = 512,
    eos_token_ids: Sequence[int] = (2,),
) -> dict:
    """A `config.json` dict with every field of the real release, scaled down."""
    if mixer_types is None:
        if num_layers < 1:
            raise ConfigError(f"--layers {num_layers}: a model needs at least 1 layer", "pass --layers 1 or more")
        mixer_types = [SPARSE] + [LIGHTNING] * max(num_layers - 2, 0) + ([SPARSE] if num_layers > 1 else [])
    mixer_types = list(mixer_types)
    cfg = {
        "architectures": ["MiniCPMSALAForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_minicpm_sala.MiniCPMSALAConfig",
            "AutoModel": "modeling_minicpm_sala.MiniCPMSALAModel",
            "AutoModelForCausalLM": "modeling_minicpm_sala.MiniCPMSALAForCausalLM",
        },
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_use_output_gate": True,
        "attn_use_rope": False,
        "bos_token_id": 1,
        "dim_model_base": 256,
        "eos_token_id": list(eos_token_ids) if len(eos_token_ids) > 1 else eos_token_ids[0],
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.1,
        "intermediate_size": intermediate_size,
        "lightning_head_dim": lightning_head_dim,
        "lightning_nh": lightning_nh,
        "lightning_nkv": lightning_nh,
        "lightning_scale": "1/sqrt(d)",
        "lightning_use_rope": True,
        "max_position_embeddings": 524288,
        "mixer_types": mixer_types,
        "model_type": "minicpm_sala",
        "mup_denominator": 32,
        "num_attention_heads": num_attention_heads,
        "num_hidden_layers": len(mixer_types),
        "num_key_value_heads": num_key_value_heads,
        "pad_token_id": 2,
        "pretraining_tp": 1,
        "qk_norm": True,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "scale_depth": 1.4,
        "scale_emb": 12,
        "sparse_config": {
            "block_size": 64,
            "dense_len": 8192,
            "init_blocks": 1,
            "kernel_size": 32,
            "kernel_stride": 16,
            "topk": 64,
            "use_nope": False,
            "window_size": 2048,
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.56.0",
        "use_cache": True,
        "use_output_gate": True,
        "use_output_norm": True,
        "vocab_size": vocab_size,
    }
    return cfg


def corpus(n_lines: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 24))) for _ in range(n_lines)]


def train_tokenizer(vocab_size: int, seed: int) -> Tokenizer:
    """A byte-level BPE tokenizer with SALA's special tokens at ids 0.. (bos 1, eos 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(400, seed), trainer=trainer)
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def random_weights(cfg: SalaConfig, seed: int, dtype: torch.dtype = torch.bfloat16, std: float = 0.02) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in sorted(cfg.tensor_shapes().items()):
        if len(shape) == 1:  # norm weights: near one, not exactly, so a missing norm is visible
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            t = std * torch.randn(shape, generator=gen)
        tensors[name] = t.to(dtype)
    return tensors


def make_tiny_model(
    out_dir: str | Path,
    *,
    num_layers: int = 4,
    mixer_types: Optional[Sequence[str]] = None,
    hidden_size: int = 256,
    intermediate_size: int = 640,
    num_attention_heads: int = 2,
    num_key_value_heads: int = 1,
    lightning_nh: int = 2,
    head_dim: int = 128,
    vocab_size: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = 2 << 20,
    force: bool = False,
    config_overrides: Optional[dict] = None,
) -> Path:
    """Write a random SALA checkpoint to `out_dir` (atomically) and return its path. `config_overrides` are
    config.json fields set on top (e.g. `attn_use_output_gate=False`)."""
    if vocab_size < 300:
        raise ConfigError("vocab_size must be at least 300 for the byte-level tokenizer (256 bytes + merges)")
    tok = train_tokenizer(vocab_size, seed)
    im_end = tok.token_to_id("<|im_end|>")
    raw = tiny_config_dict(
        num_layers=num_layers,
        mixer_types=mixer_types,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        lightning_nh=lightning_nh,
        lightning_head_dim=head_dim,
        vocab_size=vocab_size,
        eos_token_ids=(2, im_end),
    )
    raw.update(config_overrides or {})
    cfg = SalaConfig.from_dict(raw, source="tiny-model arguments")
    out_dir = Path(out_dir)
    with atomic_dir(out_dir, force=force) as tmp:
        _write_json(tmp / "config.json", raw)
        _write_json(
            tmp / "generation_config.json",
            {"bos_token_id": 1, "eos_token_id": [2, im_end], "pad_token_id": 2, "do_sample": True,
             "temperature": 0.9, "top_p": 0.95, "transformers_version": "4.56.0"},
        )
        tok.save(str(tmp / "tokenizer.json"))
        _write_json(
            tmp / "tokenizer_config.json",
            {
                "add_bos_token": True,
                "add_eos_token": False,
                "bos_token": "<s>",
                "eos_token": "<|im_end|>",
                "pad_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 524288,
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": CHAT_TEMPLATE,
                "additional_special_tokens": SPECIAL_TOKENS[3:],
            },
        )
        _write_json(
            tmp / "special_tokens_map.json",
            {"bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "</s>", "unk_token": "<unk>"},
        )
        for module, name in (("configuration_minicpm_sala.py", "the config class"), ("modeling_minicpm_sala.py", "the modeling code")):
            (tmp / module).write_text(REMOTE_CODE_PLACEHOLDER.format(name=name), encoding="utf-8")
        save_state_dict(random_weights(cfg, seed, dtype), tmp, max_shard_bytes=max_shard_bytes)
    return out_dir


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
