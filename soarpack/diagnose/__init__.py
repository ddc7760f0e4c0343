"""`soarpack diagnose LOG_OR_DIR...`: a failed run's logs and results turned into known causes and fixes.

Reads platform and rehearsal logs (prepare_env.log, prepare_model.log, quantize.log, a server log, a kept `check`
folder) and soarpack's eval/bench results, and names each failure of the catalogue (catalogue.toml: the signature,
the cause, the fix, and where the signature's text comes from). A log that no known error explains still gets its
lines worth reading. Exit codes: 0 nothing found, 1 a known failure, 2 bad input (soarpack.errors).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from soarpack.diagnose.catalogue import Entry, load_catalogue
from soarpack.diagnose.inputs import Input, read_inputs
from soarpack.diagnose.results import result_findings
from soarpack.diagnose.scan import Excerpt, Finding, excerpt, match_entries

UNVERIFIED_NOTE = "unverified: no source shows this signature's text; the cause is a guess"


@dataclass
class Diagnosis:
    inputs: List[Input]
    findings: List[Finding] = field(default_factory=list)
    excerpts: List[Excerpt] = field(default_factory=list)
    entries: Dict[str, Entry] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.findings else 0

    def entry(self, finding: Finding) -> Entry:
        return self.entries[finding.entry_id]

    def to_dict(self) -> Dict[str, Any]:
        findings = []
        for f in self.findings:
            e = self.entry(f)
            findings.append({**asdict(f), "title": e.title, "severity": e.severity, "cause": e.cause, "fix": e.fix,
                             "unverified": e.unverified, "sources": [asdict(s) for s in e.sources],
                             **({"note": UNVERIFIED_NOTE} if e.unverified else {})})
        return {
            "inputs": [{"path": str(i.path), "kind": i.kind, "truncated": i.truncated} for i in self.inputs],
            "findings": findings,
            "unrecognised": [asdict(x) for x in self.excerpts],
            "exit_code": self.exit_code,
        }


def diagnose_inputs(inputs: List[Input], entries: Optional[List[Entry]] = None) -> Diagnosis:
    entries = load_catalogue() if entries is None else entries
    diagnosis = Diagnosis(inputs, entries={e.id: e for e in entries})
    for inp in inputs:
        if inp.kind in ("eval", "bench"):
            diagnosis.findings.extend(result_findings(inp))
            continue
        found = match_entries(inp, entries, inputs)
        diagnosis.findings.extend(found)
        if not any(diagnosis.entries[f.entry_id].severity == "error" for f in found):
            x = excerpt(inp)
            if x is not None:
                diagnosis.excerpts.append(x)
    return diagnosis


def diagnose(paths: Sequence[Path], entries: Optional[List[Entry]] = None) -> Diagnosis:
    """Read every log and result under `paths` and name the known failures in them."""
    return diagnose_inputs(read_inputs([Path(p) for p in paths]), entries)


def diagnose_text(text: str, kind: str = "log", name: str = "<text>", entries: Optional[List[Entry]] = None) -> Diagnosis:
    """The same for text in hand (a step's captured output)."""
    return diagnose_inputs([Input(Path(name), kind, text)], entries)


__all__ = ["Diagnosis", "diagnose", "diagnose_inputs", "diagnose_text", "UNVERIFIED_NOTE"]

from soarpack.apinames import make_callable as _make_callable

_make_callable(__name__)  # `soarpack.diagnose(...)` is soarpack.api.diagnose
