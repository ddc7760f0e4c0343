"""conftest.NEEDS_TORCH is the explicit list of test files the torch-less Python 3.10 leg leaves out: every other
test file must import without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import NEEDS_TORCH

TESTS = Path(__file__).resolve().parent


def test_every_file_not_listed_imports_without_torch():
    names = sorted(p.stem for p in TESTS.glob("test_*.py") if p.name not in NEEDS_TORCH)
    assert names and set(NEEDS_TORCH) <= {p.name for p in TESTS.glob("test_*.py")}
    # `sys.modules[name] = None` makes `import name` raise ImportError, as on a machine without it.
    code = ("import sys, importlib\n"
            "for blocked in ('torch', 'gptqmodel'): sys.modules[blocked] = None\n"
            f"sys.path[:0] = [{str(TESTS)!r}, {str(TESTS.parent)!r}]\n"
            f"failed = []\n"
            f"for name in {names!r}:\n"
            "    try: importlib.import_module(name)\n"
            "    except ImportError as exc: failed.append(f'{name}: {exc}')\n"
            "print('\\n'.join(failed)); sys.exit(1 if failed else 0)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-2000:]
