"""Does the installed fla compute SALA's GLA the way soarpack does? Decided once per run, in the sanity phase.

The platform image's fla is whatever version it was built with, and its API moved (head-first by default in
0.1.x, deprecated in 0.2-0.4, an error from 0.5; the ops moved to fla-core at 0.3). So on a GPU the sanity
forward runs the held-out rows through both fla's kernels and soarpack's torch GLA (weights fetched once, see
soarpack.sala.streaming) and compares the logits. When fla raises or disagrees, the whole run uses the torch path.

The bound, relative Frobenius difference of the logits ≤ 2e-2: benchmarks/RESULTS.md §1 measured fla's chunk kernel
at 1.5e-3 relative error per GLA call in fp32 inputs (TF32) and every implementation at 3-4e-3 with bf16 inputs, the
rounding of bf16 itself (2^-8 ≈ 3.9e-3); the residual stream is rounded to bf16 after every layer, so two correct
paths differ by a few bf16 roundings at the logits. A wrong layout, scale or decay changes the logits by O(1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import torch

FLA_AGREEMENT_RTOL = 2e-2


@dataclass(frozen=True)
class GlaVerdict:
    backend: str  # what the rest of the run uses: "auto" (fla on CUDA), "torch", or the one the user forced
    stream: str  # which streamed result holds the reference logits
    rel_diff: Optional[float] = None  # fla vs torch, when compared
    bound: float = FLA_AGREEMENT_RTOL
    problem: str = ""  # one loud line when fla was dropped

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def backends_to_compare(device: str) -> Tuple[str, ...]:
    """("fla", "torch") when this run would use fla (a CUDA device, backend auto, fla importable); else the one
    backend in force (a CPU run never uses fla: nothing to compare)."""
    from soarpack.sala.gla import current_backend, fla_available

    current = current_backend()
    if device.startswith("cuda") and current == "auto" and fla_available():
        return ("fla", "torch")
    return (current,)


def judge_backends(streams: Dict[str, Any], rtol: float = FLA_AGREEMENT_RTOL) -> GlaVerdict:
    """The backend for the rest of the run from `soarpack.sala.streaming.streamed_logits` results. A failure of
    the torch path (or of the only backend) is the caller's error and is raised."""
    if set(streams) != {"fla", "torch"}:
        (only, result), = streams.items()
        if result.error is not None:
            raise result.error
        return GlaVerdict(backend=only, stream=only)
    if streams["torch"].error is not None:
        raise streams["torch"].error
    fla = streams["fla"]
    if fla.error is not None:
        return GlaVerdict("torch", "torch", problem=f"fla's GLA raised {type(fla.error).__name__}: "
                          f"{str(fla.error)[:160]}; the whole quantization runs on soarpack's torch GLA (slower)")
    diff = relative_difference(fla.outputs, streams["torch"].outputs)
    if not diff <= rtol:  # NaN included
        return GlaVerdict("torch", "torch", diff, rtol, problem=f"fla's GLA disagrees with soarpack's torch GLA "
                          f"(relative logit difference {diff:.2e} > {rtol:.0e}); the whole quantization runs on "
                          f"soarpack's torch GLA (slower)")
    return GlaVerdict("auto", "fla", diff, rtol)


def relative_difference(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """‖a − b‖ / ‖b‖ over all rows together (Frobenius, float64)."""
    num = sum(float((x.double() - y.double()).pow(2).sum()) for x, y in zip(a, b, strict=True))
    den = sum(float(y.double().pow(2).sum()) for y in b)
    return (num / max(den, 1e-300)) ** 0.5
