"""`soarpack tiny-model` / `soarpack.tiny_model()`: its request, declared once (soarpack.request derives the
command's options, the API's signature and help, and the README's rows). The bounds are the library's
(soarpack.sala.tinyshape), checked as the request is made, before torch is imported: one validator for the command
and the API."""

from __future__ import annotations

from typing import List, Optional

from pydantic import model_validator

from soarpack.request import LoosePath, Option, Request


class TinyModelRequest(Request):
    out: LoosePath = Option(..., argument=True, metavar="OUT", help="Directory to write the checkpoint to.")
    layers: int = Option(4, "--layers", metavar="N", help="Number of decoder layers.")
    pattern: Optional[str] = Option(None, "--pattern", metavar="SL...",
                                    help="Layer kinds as a string of S (sparse, minicpm4) and L (lightning), e.g. "
                                         "SLLS. Overrides --layers.")
    hidden: int = Option(256, "--hidden", metavar="N", help="hidden_size (a multiple of 128 keeps it Marlin-shaped).")
    intermediate: int = Option(640, "--intermediate", metavar="N", help="intermediate_size.")
    heads: int = Option(2, "--heads", metavar="N", help="Attention heads of both layer kinds (head_dim 128).")
    kv_heads: int = Option(1, "--kv-heads", metavar="N", help="KV heads of the sparse layers.")
    vocab: int = Option(512, "--vocab", metavar="N", help="Vocabulary size (tokenizer trained to it).")
    seed: int = Option(0, "--seed", metavar="N", help="Seed for weights and tokenizer.")
    force: bool = Option(False, "--force", help="Replace a non-empty output directory.")

    def kinds(self) -> Optional[List[str]]:
        """The layer kinds of --pattern, or None (then --layers layers of the default kinds)."""
        from soarpack.sala.tinyshape import mixer_types

        return mixer_types(self.pattern)

    @model_validator(mode="after")
    def _shape(self) -> "TinyModelRequest":
        from soarpack.sala.tinyshape import check_tiny_shape

        kinds = self.kinds()
        check_tiny_shape(layers=len(kinds) if kinds else self.layers, hidden=self.hidden,
                         intermediate=self.intermediate, heads=self.heads, kv_heads=self.kv_heads, vocab=self.vocab)
        return self
