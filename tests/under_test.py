"""The checkout whose soarpack the tests imported, so a child interpreter runs the same one (also when the tests are
pointed at another tree with PYTHONPATH)."""

from __future__ import annotations

from pathlib import Path

import soarpack

SOARPACK_ROOT = str(Path(soarpack.__file__).resolve().parents[1])
