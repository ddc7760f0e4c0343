"""The code of patch 04-w4-dispatch's block, read from the patch file itself and run as a module.

The patch adds one self-contained block (between `# --- soarpack w4-dispatch: begin` and `... end ---`) to the
fork's marlin_utils.py; it needs only os, torch and triton. Its added lines are the block verbatim, so
`load_dispatch_block()` runs exactly what a patched server runs, without a fork tree. (benchmarks/
w4_dispatch_block.py reads the same block from a patched tree instead.)
"""

from __future__ import annotations

import os
import tempfile
import types
from pathlib import Path
from typing import Optional

from soarpack.errors import ConfigError

PATCH_NAME = "04-w4-dispatch.patch"
BEGIN = "# --- soarpack w4-dispatch: begin"
END = "# --- soarpack w4-dispatch: end ---"
ENV = "SOARPACK_W4_DISPATCH"


def patch_path(directory: Optional[Path] = None) -> Path:
    from soarpack.serve.patches import patch_dir

    path = Path(directory or patch_dir()) / PATCH_NAME
    if not path.is_file():
        raise ConfigError(f"{path} is missing", "run from a soarpack checkout that has sglang/04-w4-dispatch.patch")
    return path


def block_source(patch: Optional[Path] = None) -> str:
    """The block's text: the patch's added lines from the begin marker to the end marker."""
    path = Path(patch) if patch else patch_path()
    out, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("+") or line.startswith("+++"):
            if inside and not line.startswith("+"):
                raise ConfigError(f"{path.name}: the w4-dispatch block is interrupted by a context line",
                                  "the block must be added as one run of lines")
            continue
        text = line[1:]
        if text.startswith(BEGIN):
            inside = True
        if inside:
            out.append(text)
        if text.startswith(END):
            break
    if not out or not out[-1].startswith(END):
        raise ConfigError(f"{path.name} holds no complete soarpack w4-dispatch block", "check the patch file")
    return "\n".join(out) + "\n"


def load_dispatch_block(patch: Optional[Path] = None, dispatch: Optional[str] = None) -> types.ModuleType:
    """The block as a module. `dispatch` is the SOARPACK_W4_DISPATCH text it reads at import (None: the
    environment's, as a server would)."""
    module = types.ModuleType("soarpack_w4_dispatch_block")
    source = block_source(patch)
    # Triton reads a @triton.jit function's source back from its file: the block must live in a .py file of its
    # own (the patch's lines carry "+" prefixes at other line numbers).
    where = Path(tempfile.mkdtemp(prefix="soarpack-w4-block-")) / "soarpack_w4_dispatch_block.py"
    where.write_text(source, encoding="utf-8")
    module.__file__ = str(where)
    saved = os.environ.get(ENV)
    try:
        if dispatch is not None:
            os.environ[ENV] = dispatch
        exec(compile(source, module.__file__, "exec", dont_inherit=True), module.__dict__)
    finally:
        if dispatch is not None:
            if saved is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = saved
    return module
