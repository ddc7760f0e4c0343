"""Unknown keys are errors, and the error names the nearest known key (a misspelt table is never ignored)."""

from __future__ import annotations

import difflib
from typing import Iterable, Mapping, Optional

from soarpack.errors import ConfigError


def nearest(key: str, known: Iterable[str]) -> Optional[str]:
    """The known key closest to `key` (difflib), or None when none is close; case is ignored."""
    by_lower = {k.lower(): k for k in known}
    hits = difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[hits[0]] if hits else None


def check_keys(table: Mapping[str, object], known: Iterable[str], where: str, *, table_name: str = "",
               elsewhere: Optional[Mapping[str, str]] = None) -> None:
    """Refuse the first key of `table` (the TOML table `table_name`, "" for the top level) that is not in `known`,
    naming the nearest known key.

    `elsewhere`: keys known at another place of the file ({"fallback": "[serve].fallback"}), so that a key at the
    wrong level is told where it belongs."""
    known = list(known)
    elsewhere = dict(elsewhere or {})
    for key, value in table.items():
        if key in known:
            continue
        if table_name:
            what = f"key {table_name}.{key}"
        else:
            what = f"table [{key}]" if isinstance(value, dict) else f"key {key}"
        if key in elsewhere:
            raise ConfigError(f"{where}: unknown {what}", f"it belongs in {elsewhere[key]}")
        guess = nearest(key, known)
        if guess is not None:
            hint = f"did you mean {guess}? known: {', '.join(known)}"
        elif nearest(key, elsewhere) is not None:
            hint = f"did you mean {elsewhere[nearest(key, elsewhere)]}?"
        else:
            hint = f"known: {', '.join(known)}"
        raise ConfigError(f"{where}: unknown {what}", hint)


def read_evidence(raw: object, where: str) -> list:
    """A recipe's or profile's `[[evidence]]` tables: unknown keys named with the nearest known one, then the
    entries validated by soarpack.evidence.load_evidence (the one reader of evidence)."""
    from soarpack.evidence import Evidence, load_evidence

    if isinstance(raw, list):
        for k, entry in enumerate(raw, 1):
            if isinstance(entry, dict):
                check_keys(entry, Evidence.model_fields, f"{where} evidence {k}", table_name="[[evidence]]")
    return load_evidence({"evidence": raw}, where)
