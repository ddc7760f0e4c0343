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
    relation = "this"        # optional: "this" (measured on this recipe/profile) or "related" (a nearby one:
                             # informs, but is never read as this thing's result)
    risk = "..."             # optional: why this entry makes the recipe or profile risky (a verdict shows it)

`load_evidence(raw)` reads and validates the `[[evidence]]` list of a parsed TOML file (the recipe and profile
loaders call it); `Evidence.line()` is the one way a verdict shows an entry.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from soarpack.errors import ConfigError

EvidenceKind = Literal["platform", "soarpack", "none"]
EvidenceRelation = Literal["this", "related"]
FIGURES = ("acc_ori", "acc_ori_low", "s1", "s8", "smax")


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
    relation: EvidenceRelation = "this"
    risk: Optional[str] = None

    @property
    def acc_range(self) -> Optional[tuple]:
        """(lowest, highest) ori accuracy the source states; None when it states none."""
        if self.acc_ori is None:
            return None
        return (self.acc_ori if self.acc_ori_low is None else self.acc_ori_low, self.acc_ori)

    def line(self) -> str:
        """One line: kind, summary, the figures given and the source."""
        figures = []
        if self.acc_ori is not None:
            low = "" if self.acc_ori_low is None else f"{self.acc_ori_low:g}-"
            figures.append(f"ori {low}{self.acc_ori:g}")
        speed = [f"{v:g}" if v is not None else "?" for v in (self.s1, self.s8, self.smax)]
        if any(v is not None for v in (self.s1, self.s8, self.smax)):
            figures.append(f"S1/S8/Smax {'/'.join(speed)} s")
        if self.kind != "none":
            figures.append(f"stack {self.stack}")
            figures.append(f"args {self.args}")
        rel = " (a related configuration)" if self.relation == "related" else ""
        shown = f" [{'; '.join(figures)}]" if figures else ""
        flag = f"; risk: {self.risk}" if self.risk else ""
        return f"{self.kind}{rel}: {self.summary}{shown}{flag} ({self.source})"


def _check_entry(entry: Evidence, where: str) -> None:
    if not entry.source.strip() or not entry.summary.strip():
        raise ConfigError(f"{where}: source and summary must not be empty",
                          "cite where the figure is written down, e.g. docs/evidence.md#w4-full")
    given = [name for name in FIGURES if getattr(entry, name) is not None]
    if entry.kind == "none" and given:
        raise ConfigError(f"{where}: kind = \"none\" (nothing measured) but it gives {', '.join(given)}",
                          'use kind = "platform" or "soarpack" for a measured figure')
    for name in ("acc_ori", "acc_ori_low"):
        value = getattr(entry, name)
        if value is not None and not 0.0 <= value <= 100.0:
            raise ConfigError(f"{where}: {name} = {value:g} is not an accuracy in [0, 100]", "ori accuracy is in points")
    for name in ("s1", "s8", "smax"):
        value = getattr(entry, name)
        if value is not None and not value > 0:
            raise ConfigError(f"{where}: {name} = {value:g} must be a positive duration in seconds")
    if entry.acc_ori_low is not None and (entry.acc_ori is None or entry.acc_ori_low > entry.acc_ori):
        raise ConfigError(f"{where}: acc_ori_low needs an acc_ori at least as high",
                          "a range is acc_ori_low .. acc_ori, e.g. 75 .. 77.5")


def load_evidence(raw: Dict[str, Any], where: str = "evidence") -> List[Evidence]:
    """The `[[evidence]]` entries of a parsed recipe or profile file, validated (an absent list is empty)."""
    entries = raw.get("evidence", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: evidence must be an array of tables ([[evidence]])",
                          "write each entry as its own [[evidence]] table")
    out = []
    for k, item in enumerate(entries, 1):
        at = f"{where} evidence {k}"
        if not isinstance(item, dict):
            raise ConfigError(f"{at}: an evidence entry must be a table ([[evidence]])")
        try:
            entry = Evidence.model_validate(item, strict=True)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(p) for p in err["loc"]) or "entry"
            given = "missing" if err["type"] == "missing" else repr(err.get("input"))
            raise ConfigError(f"{at}: {name} = {given}: {err['msg'][0].lower()}{err['msg'][1:]}",
                              "keys: " + ", ".join(Evidence.model_fields)) from None
        _check_entry(entry, at)
        out.append(entry)
    return out
