"""The code of patches 04-w4-dispatch and 05-fp8-prefill, read from the patch files themselves and run as a module.

Each patch adds one self-contained block to the fork's marlin_utils.py (between `# --- soarpack NAME: begin` and
`... end ---`); 04's needs only os, torch and triton, 05's needs 04's block above it and, on a GPU, sgl_kernel's
fp8 ops. Their added lines are the blocks verbatim, so `load_dispatch_block()` runs exactly what a patched server
runs, without a fork tree. (benchmarks/w4_dispatch_block.py reads the same blocks from a patched tree instead.)
"""

from __future__ import annotations

import os
import tempfile
import types
from pathlib import Path
from typing import Dict, Optional

from soarpack.errors import ConfigError

PATCH_NAME = "04-w4-dispatch.patch"
BEGIN = "# --- soarpack w4-dispatch: begin"
END = "# --- soarpack w4-dispatch: end ---"
ENV = "SOARPACK_W4_DISPATCH"
FP8_PATCH_NAME = "05-fp8-prefill.patch"
FP8_BEGIN = "# --- soarpack fp8-prefill: begin"
FP8_END = "# --- soarpack fp8-prefill: end ---"
FP8_ENV = "SOARPACK_FP8_PREFILL"


def patch_path(directory: Optional[Path] = None, name: str = PATCH_NAME) -> Path:
    from soarpack.serve.patches import patch_dir

    path = Path(directory or patch_dir()) / name
    if not path.is_file():
        raise ConfigError(f"{path} is missing", f"run from a soarpack checkout that has sglang/{name}")
    return path


def block_source(patch: Optional[Path] = None, begin: str = BEGIN, end: str = END) -> str:
    """A block's text: the patch's added lines from the begin marker to the end marker."""
    path = Path(patch) if patch else patch_path(name=PATCH_NAME if begin == BEGIN else FP8_PATCH_NAME)
    what = begin[len("# --- "):].split(":")[0]
    out, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("+") or line.startswith("+++"):
            if inside and not line.startswith("+"):
                raise ConfigError(f"{path.name}: the {what} block is interrupted by a context line",
                                  "the block must be added as one run of lines")
            continue
        text = line[1:]
        if text.startswith(begin):
            inside = True
        if inside:
            out.append(text)
        if text.startswith(end):
            break
    if not out or not out[-1].startswith(end):
        raise ConfigError(f"{path.name} holds no complete {what} block", "check the patch file")
    return "\n".join(out) + "\n"


def load_dispatch_block(patch: Optional[Path] = None, dispatch: Optional[str] = None, *, fp8: bool = False,
                        fp8_patch: Optional[Path] = None, fp8_spec: Optional[str] = None) -> types.ModuleType:
    """Patch 04's block as a module, with patch 05's block after it when `fp8`. `dispatch` / `fp8_spec` are the
    SOARPACK_W4_DISPATCH / SOARPACK_FP8_PREFILL texts they read at import (None: the environment's, as a server
    would)."""
    module = types.ModuleType("soarpack_w4_dispatch_block")
    source = block_source(patch)
    if fp8:
        source += "\n\n" + block_source(fp8_patch, FP8_BEGIN, FP8_END)
    # Triton reads a @triton.jit function's source back from its file: the block must live in a .py file of its
    # own (the patch's lines carry "+" prefixes at other line numbers).
    where = Path(tempfile.mkdtemp(prefix="soarpack-w4-block-")) / "soarpack_w4_dispatch_block.py"
    where.write_text(source, encoding="utf-8")
    module.__file__ = str(where)
    env: Dict[str, Optional[str]] = {ENV: dispatch, FP8_ENV: fp8_spec}
    saved = {k: os.environ.get(k) for k, v in env.items() if v is not None}
    try:
        for k, v in env.items():
            if v is not None:
                os.environ[k] = v
        exec(compile(source, module.__file__, "exec", dont_inherit=True), module.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return module
