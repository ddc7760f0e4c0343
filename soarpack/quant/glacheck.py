"""Does the installed fla compute SALA's GLA the way soarpack does? Decided once per run, in the sanity phase.

The platform image's fla is whatever version it was built with, and its API moved (head-first by default in
0.1.x, deprecated in 0.2-0.4, an error from 0.5; the ops moved to fla-core at 0.3). So on a GPU the sanity forward
runs on soarpack's torch GLA (the reference: within 2.5e-7 of float64) and, at every Lightning layer, hands the
same q, k, v to fla's kernel and compares the two outputs. When fla raises or disagrees, the whole run uses the
torch path, with one loud line. This happens only when fla was asked for (SOARPACK_GLA_BACKEND=fla): the default is
the torch path, which needs no check.

The comparison is per GLA call, not on the logits: on a 32-layer model with random weights two correct GLA paths
already differ by 4e-2 in the logits (measured on the H200: the bf16 residual stream amplifies rounding through
the depth), while a call's own output is where the kernels are comparable. The bound, relative Frobenius
difference ≤ 1e-2 over all calls: benchmarks/RESULTS.md §1 measured fla's chunk kernel at 1.5e-3 from float64 with
fp32 inputs (TF32; SALA casts q, k, v to fp32), soarpack's torch path at 2.5e-7; a wrong layout, scale or decay is
off by O(1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

import torch

FLA_AGREEMENT_RTOL = 1e-2


@dataclass(frozen=True)
class GlaVerdict:
    backend: str  # what the rest of the run uses: the one in force ("torch" or "fla"), or "torch" after a failed check
    rel_diff: Optional[float] = None  # fla vs torch over the compared calls
    calls: int = 0  # GLA calls compared
    bound: float = FLA_AGREEMENT_RTOL
    problem: str = ""  # one loud line when fla was dropped

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class FlaComparison:
    """An observer for `soarpack.sala.gla.observe_torch_path`: runs fla on each observed call's inputs and sums the
    squared difference to the torch output (float64). The first exception fla raises is kept; no call after it."""

    def __init__(self) -> None:
        self.num = self.den = 0.0
        self.calls = 0
        self.error: Optional[BaseException] = None

    def __call__(self, q, k, v, g, scale, initial_state, torch_out: torch.Tensor) -> None:
        from soarpack.sala.gla import fla_gla

        if self.error is not None:
            return
        try:
            fla_out, _ = fla_gla(q, k, v, g, scale, initial_state)
        except Exception as exc:  # noqa: BLE001 - any failure of fla's kernels means: do not use them
            self.error = exc
            return
        self.num += float((fla_out.double() - torch_out.double()).pow(2).sum())
        self.den += float(torch_out.double().pow(2).sum())
        self.calls += 1

    @property
    def rel_diff(self) -> float:
        return (self.num / max(self.den, 1e-300)) ** 0.5


def should_compare(device: str) -> bool:
    """True when this run would use fla: a CUDA device, fla asked for (SOARPACK_GLA_BACKEND=fla) and importable.
    The default backend is soarpack's torch GLA, which needs no check; a CPU run never uses fla."""
    from soarpack.sala.gla import current_backend, fla_available

    return device.startswith("cuda") and current_backend() == "fla" and fla_available()


def judge(comparison: Optional[FlaComparison], rtol: float = FLA_AGREEMENT_RTOL) -> GlaVerdict:
    """The backend for the rest of the run: the one in force when nothing was compared, else fla only if it ran
    and agreed."""
    from soarpack.sala.gla import current_backend

    if comparison is None or (comparison.calls == 0 and comparison.error is None):
        return GlaVerdict(backend=current_backend())
    if comparison.error is not None:
        err = comparison.error
        return GlaVerdict("torch", calls=comparison.calls, problem=f"fla's GLA raised {type(err).__name__}: "
                          f"{str(err)[:160]}; the whole quantization runs on soarpack's torch GLA (slower)")
    diff = comparison.rel_diff
    if not diff <= rtol:  # NaN included
        return GlaVerdict("torch", diff, comparison.calls, rtol, problem=f"fla's GLA disagrees with soarpack's torch "
                          f"GLA (relative difference {diff:.2e} > {rtol:.0e} over {comparison.calls} calls); the "
                          f"whole quantization runs on soarpack's torch GLA (slower)")
    return GlaVerdict(current_backend(), diff, comparison.calls, rtol)
