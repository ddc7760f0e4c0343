"""Which installer `soarpack check`'s rehearsal gives prepare_env.sh: uv, as the platform image has, when this
environment has one, else pip.

prepare_env.sh takes uv from PATH (`command -v uv`). The quick start runs `.venv/bin/soarpack` without activating
the venv, so `.venv/bin` is not on PATH although the venv's uv is there: uv is looked for beside the Python that
runs soarpack first, then on PATH, and the rehearsal puts the one found on the PATH it gives prepare_env.sh.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional

UV_PIP, PIP = "uv pip", "pip"


@dataclass(frozen=True)
class Installer:
    name: str  # UV_PIP or PIP: what prepare_env.sh will install with
    uv: Optional[str]  # the uv found, or None
    why: str  # where it was found, or where it was looked for

    def to_dict(self) -> Dict[str, Optional[str]]:
        return asdict(self)


def find_installer(executable: Optional[str] = None, path: Optional[str] = None) -> Installer:
    """uv beside `executable` (default: the Python running soarpack; its venv's bin/, unresolved: a venv's
    python is a link to the base interpreter), else on `path` (default: $PATH), else pip."""
    bindir = Path(executable or sys.executable).parent
    beside = bindir / "uv"
    if beside.is_file() and os.access(beside, os.X_OK):
        return Installer(UV_PIP, str(beside), f"uv at {beside}, beside soarpack's Python")
    on_path = shutil.which("uv", path=path)
    if on_path:
        return Installer(UV_PIP, on_path, f"uv at {on_path}, on PATH")
    return Installer(PIP, None, f"no uv beside soarpack's Python ({bindir}) or on PATH "
                                "(the platform installs with uv: `pip install uv` into this venv)")


def expose(installer: Installer, tools_dir: Path) -> List[str]:
    """PATH entries that give a shell this installer's uv (a folder holding only a link to it, so no other
    program of its folder comes along, such as the venv's python); none for pip."""
    if installer.uv is None:
        return []
    tools_dir.mkdir(parents=True, exist_ok=True)
    link = tools_dir / "uv"
    if not link.exists():
        link.symlink_to(installer.uv)
    return [str(tools_dir)]


def installer_that_ran(prepare_env_output: str) -> Optional[str]:
    """UV_PIP or PIP, from the `run:` lines prepare_env.sh logs; None when it installed nothing."""
    for line in prepare_env_output.splitlines():
        _, sep, cmd = line.partition("] run: ")
        if not sep:
            continue
        if cmd.startswith("uv pip install"):
            return UV_PIP
        if " -m pip " in f" {cmd} " and " install" in cmd:
            return PIP
    return None
