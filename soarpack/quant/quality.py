"""The quality math of a quantization run: next-token loss and log-probabilities, and the KL of one model's
distribution against another's (soarpack.quant.run's sanity and quality phases use them)."""

from __future__ import annotations

from typing import Dict, List, Sequence

import torch


def next_token_loss(logprobs: Sequence[torch.Tensor], rows: Sequence[Sequence[int]]) -> float:
    """Mean next-token cross entropy (nats) from the per-row log-probabilities of `next_token_logprobs`."""
    total, count = 0.0, 0
    for lp, ids in zip(logprobs, rows):
        targets = torch.tensor(list(ids)[1:], dtype=torch.long)
        total -= float(lp[:-1].gather(-1, targets.unsqueeze(-1)).sum())
        count += len(targets)
    return total / max(count, 1)


def next_token_logprobs(model: torch.nn.Module, rows: Sequence[Sequence[int]], device: str) -> List[torch.Tensor]:
    """Per-row log-probabilities [T, vocab] of a whole model (the layer-streamed runs use `logprobs_of`)."""
    with torch.no_grad():
        return logprobs_of([model(torch.tensor([list(ids)], device=device))[0].cpu() for ids in rows])


def logprobs_of(logits: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """float32 log-softmax of each row's logits [T, vocab], on the CPU."""
    return [torch.log_softmax(x.float(), dim=-1) for x in logits]


def kl_stats(ref_logprobs: Sequence[torch.Tensor], new_logprobs: Sequence[torch.Tensor]) -> Dict[str, float]:
    """KL(ref ‖ new) per position: mean and max, plus top-1 agreement."""
    kls, agree, n = [], 0, 0
    for p, q in zip(ref_logprobs, new_logprobs):
        kls.append((p.exp() * (p - q)).sum(-1))
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        n += p.shape[0]
    allk = torch.cat(kls)
    return {"kl_mean": float(allk.mean()), "kl_max": float(allk.max()), "top1_agreement": agree / max(n, 1),
            "positions": n}
