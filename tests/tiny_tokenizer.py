"""A word-level tokenizer folder for the bench and eval tests (the fake server's streamed words are in its vocabulary)."""

from __future__ import annotations

import json


def make_tiny_tokenizer(out_dir, text: str = "", eos_ids=(2,)) -> str:
    """A word-level HF tokenizer dir (tokenizer.json + tokenizer_config.json + generation_config.json) that
    AutoTokenizer loads: ids 0 <unk>, 1 <s>, 2 </s>, 3 <|im_end|>, then every distinct word of `text` and of
    the built-in speed-set prose."""
    import os

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from soarpack.measure.speedset import BUILTIN_TEXT

    specials = ["<unk>", "<s>", "</s>", "<|im_end|>"]
    words = sorted(set((text + " " + BUILTIN_TEXT).split()) | {"tok"})
    vocab = {tok: i for i, tok in enumerate(specials + words)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   additional_special_tokens=["<|im_end|>"])
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as fh:
        json.dump({"bos_token_id": 1, "eos_token_id": list(eos_ids)}, fh)
    return str(out_dir)
