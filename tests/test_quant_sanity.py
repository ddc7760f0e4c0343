"""The sanity loss is derived from the same forward as the quality reference: it must be the plain cross entropy."""

import torch
import torch.nn.functional as F

from soarpack.quant.quality import next_token_logprobs, next_token_loss
from soarpack.sala.checkpoint import load_model


def test_loss_from_logprobs_is_cross_entropy(tiny_model_dir):
    model = load_model(tiny_model_dir, dtype=torch.float32)
    rows = [list(range(5, 40)), list(range(100, 117))]
    total = count = 0.0
    with torch.no_grad():
        for ids in rows:
            x = torch.tensor([ids])
            total += float(F.cross_entropy(model(x)[0, :-1], x[0, 1:], reduction="sum"))
            count += len(ids) - 1
    loss = next_token_loss(next_token_logprobs(model, rows, "cpu"), rows)
    assert abs(loss - total / count) < 1e-5
    assert 5.0 < loss < 7.5  # a random model over a 512-token vocab sits near ln(512) = 6.24
