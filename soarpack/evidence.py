"""What is known about a recipe or a serving profile, each entry with its source.

A recipe or profile TOML carries a list of `[[evidence]]` tables; the typed recipe and profile hold them as
`evidence: list[Evidence]`. Verdicts (build, check, inspect, compare) read them; nothing retypes a figure.

    [[evidence]]
    kind = "platform"        # "platform": a peer's run on the SOAR platform; "soarpack": measured by soarpack
                             # (benchmarks/RESULTS.md); "none": nothing measured (say so rather than leave it out)
    source = "docs/evidence.md#w4-full"   # where the figure is written down, in this repo
    summary = "full W4A16 g128 scored ~78.3 on the platform (below the full-credit line)"
    acc_ori = 78.3           # optional; a range is acc_ori_low .. acc_ori
    stack = "unknown"        # what the source states, or "unknown"; never a reconstruction
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

EvidenceKind = Literal["platform", "soarpack", "none"]


class Evidence(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: EvidenceKind
    source: str
    summary: str
    acc_ori: Optional[float] = None
    acc_ori_low: Optional[float] = None
    s1: Optional[float] = None
    s8: Optional[float] = None
    smax: Optional[float] = None
    stack: str = "unknown"
    args: str = "unknown"
