"""The README's table of environment variables names every SOARPACK_* variable soarpack reads, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the bundle runs besides the package (prepare_env.sh sources bundle.env; preprocess_model.py runs quantize).
SCRIPTS = ("prepare_env.sh", "prepare_model.sh", "preprocess_model.py")
# A variable is read where its name is quoted (os.environ.get("SOARPACK_X"), env["SOARPACK_X"] = ...) or expanded
# by a shell ($SOARPACK_X, ${SOARPACK_X:-}); a bare SOARPACK_X is a Python name (the w4 patch's SOARPACK_W4_ACTIVE).
READ = re.compile(r"""["']\$?\{?(SOARPACK_[A-Z0-9_]+)\b|\$\{?(SOARPACK_[A-Z0-9_]+)""")


def _files() -> list:
    files = [p for p in sorted((ROOT / "soarpack").rglob("*")) if p.is_file() and p.suffix in (".py", ".sh", ".toml")]
    return files + [ROOT / name for name in SCRIPTS]


def _read_names() -> dict:
    names: dict = {}
    for path in _files():
        for m in READ.finditer(path.read_text(encoding="utf-8")):
            names.setdefault(m.group(1) or m.group(2), str(path.relative_to(ROOT)))
    return names


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## The cache and the environment")
    return text[start:text.index("\n## ", start + 1)]


def test_every_soarpack_variable_read_is_in_the_readme_table():
    names = _read_names()
    assert {"SOARPACK_CACHE", "SOARPACK_PYTHON310", "SOARPACK_GLA_BACKEND"} <= set(names)  # the scan sees them
    assert "SOARPACK_W4_ACTIVE" not in names  # a Python name, not a variable
    section = _readme_section()
    missing = {n: where for n, where in names.items() if f"`{n}`" not in section}
    assert missing == {}, f"add these to README.md's table of environment variables: {missing}"


def test_the_readme_names_no_variable_that_nothing_reads_or_sets():
    used = {n for path in _files() for n in re.findall(r"SOARPACK_[A-Z0-9_]+", path.read_text(encoding="utf-8"))}
    stale = sorted(set(re.findall(r"`(SOARPACK_[A-Z0-9_]+)`", _readme_section())) - used)
    assert stale == []
