"""`soarpack diagnose LOG_OR_DIR...`: a failed run's logs and results turned into known causes and fixes.

Reads platform and rehearsal logs (prepare_env.log, prepare_model.log, quantize.log, a server log, a kept `check`
folder) and soarpack's eval/bench results, and names each failure of the catalogue (catalogue.toml: the signature,
the cause, the fix, and where the signature's text comes from). A log that no known error explains still gets its
lines worth reading. Exit codes: 0 nothing found, 1 a known failure, 2 bad input (soarpack.errors).

A finding makes the verdict (exit 1) only when it is `confirmed`: at least one hit is not a warning quoting the
signature's text, and its entry cites a source or the line it quotes is an error line itself (an unverified
pattern is a guess: on a plain line, a retry note say, it is shown but makes no verdict on its own). Inputs are diagnosed one at a time and their text dropped after, so memory holds one log.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

from soarpack.diagnosis.catalogue import Entry, load_catalogue
from soarpack.diagnosis.inputs import Input, iter_inputs
from soarpack.diagnosis.results import result_findings
from soarpack.diagnosis.scan import Excerpt, Finding, context_values, excerpt, match_entries

UNVERIFIED_NOTE = "unverified: no source shows this signature's text; the cause is a guess"


@dataclass
class Diagnosis:
    inputs: List[Input]
    findings: List[Finding] = field(default_factory=list)
    excerpts: List[Excerpt] = field(default_factory=list)
    entries: Dict[str, Entry] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  # what was not read: a log's start, files past the cap, ...

    def confirmed(self, finding: Finding) -> bool:
        """Whether the finding makes a verdict: hit outside a warning's quote, by a cited (not unverified) entry or
        on a line that is an error line itself."""
        return not finding.quoted_in_warning and (not self.entry(finding).unverified or finding.on_error_line)

    @property
    def partial(self) -> bool:
        """Whether some of what was given was not read: a log's start, or the files past the cap."""
        from soarpack.diagnosis.inputs import MAX_FILES

        return any(i.truncated for i in self.inputs) or len(self.inputs) >= MAX_FILES

    @property
    def verdicts(self) -> List[Finding]:
        return [f for f in self.findings if self.confirmed(f)]

    @property
    def exit_code(self) -> int:
        return 1 if self.verdicts else 0

    def entry(self, finding: Finding) -> Entry:
        return self.entries[finding.entry_id]

    def to_dict(self) -> Dict[str, Any]:
        findings = []
        for f in self.findings:
            e = self.entry(f)
            findings.append({**asdict(f), "title": e.title, "severity": e.severity, "cause": e.cause, "fix": e.fix,
                             "unverified": e.unverified, "sources": [asdict(s) for s in e.sources],
                             "confirmed": self.confirmed(f), **({"note": UNVERIFIED_NOTE} if e.unverified else {})})
        return {
            "inputs": [{"path": str(i.path), "kind": i.kind, "truncated": i.truncated, "size": i.size,
                        "read_from": i.read_from} for i in self.inputs],
            "findings": findings,
            "unrecognised": [asdict(x) for x in self.excerpts],
            "notes": list(self.notes),
            "exit_code": self.exit_code,
        }


def diagnose_inputs(inputs: Iterable[Input], entries: Optional[List[Entry]] = None,
                    notes: Optional[List[str]] = None) -> Diagnosis:
    """Diagnose the inputs one at a time; each text input's text is dropped once read (memory holds one log).
    A context value (e.g. the chunk size beside an OOM) missing from the failing log is taken from the others."""
    entries = load_catalogue() if entries is None else entries
    diagnosis = Diagnosis([], entries={e.id: e for e in entries}, notes=notes if notes is not None else [])
    with_context = [e for e in entries if e.context]
    seen_context: List[Dict[str, Dict[str, str]]] = []  # per input: entry id -> its context values in that input
    for inp in inputs:
        diagnosis.inputs.append(inp)
        if inp.kind in ("eval", "bench"):
            diagnosis.findings.extend(result_findings(inp))
            inp.data = None
            seen_context.append({})
            continue
        found = match_entries(inp, entries)
        diagnosis.findings.extend(found)
        if not any(diagnosis.entries[f.entry_id].severity == "error" and diagnosis.confirmed(f) for f in found):
            x = excerpt(inp)
            if x is not None:
                diagnosis.excerpts.append(x)
        seen_context.append({e.id: context_values(e, [inp.text]) for e in with_context})
        inp.text, inp.data = "", None
    by_path = {str(inp.path): i for i, inp in enumerate(diagnosis.inputs)}
    for finding in diagnosis.findings:
        entry = diagnosis.entries[finding.entry_id]
        own = by_path.get(finding.path)
        for name in entry.context:
            if name in finding.detail:
                continue
            for i, values in enumerate(seen_context):
                if i != own and name in values.get(entry.id, {}):
                    finding.detail[name] = values[entry.id][name]
                    break
    return diagnosis


def diagnose(paths: Sequence[Path], entries: Optional[List[Entry]] = None) -> Diagnosis:
    """Read every log and result under `paths` and name the known failures in them."""
    notes: List[str] = []
    return diagnose_inputs(iter_inputs([Path(p) for p in paths], notes), entries, notes)


def diagnose_text(text: str, kind: str = "log", name: str = "<text>", entries: Optional[List[Entry]] = None) -> Diagnosis:
    """The same for text in hand (a step's captured output)."""
    return diagnose_inputs([Input(Path(name), kind, text)], entries)


__all__ = ["Diagnosis", "diagnose", "diagnose_inputs", "diagnose_text", "UNVERIFIED_NOTE"]
