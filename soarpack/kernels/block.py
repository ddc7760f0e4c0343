"""The code of a patch's self-contained block, read from the patch file itself and run as a module.

Three patches add one self-contained block each to a fork file, between a `# --- soarpack NAME: begin` and a
`# --- soarpack NAME: end ---` line, needing only os, torch and triton: 04-w4-dispatch to marlin_utils.py (the W4
dispatch), 05-fp8-prefill after it in the same file (the FP8 route; it uses 04's names, so it is loaded together with
04's block: `load_dispatch_block(fp8=True)`; on a GPU it calls sgl_kernel's fp8 ops where they are registered),
06-gla-decode-in-place to hybrid_linear_attn_backend.py (the Lightning layers' in-place decode kernel).
Their added lines are the block verbatim, so `load_block()` runs exactly what a patched server runs, without a fork
tree: the patch file is the one copy of that code. (benchmarks/w4_dispatch_block.py reads the same block from a
patched tree instead.)
"""

from __future__ import annotations

import os
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from soarpack.errors import ConfigError


@dataclass(frozen=True)
class Block:
    patch: str  # the patch file's name in the patch set
    tag: str  # NAME in the begin/end marker lines
    env: str  # the variable the block reads once, at import

    @property
    def begin(self) -> str:
        return f"# --- soarpack {self.tag}: begin"

    @property
    def end(self) -> str:
        return f"# --- soarpack {self.tag}: end ---"

    @property
    def module(self) -> str:
        return "soarpack_" + self.tag.replace("-", "_") + "_block"


W4_DISPATCH = Block("04-w4-dispatch.patch", "w4-dispatch", "SOARPACK_W4_DISPATCH")
FP8_PREFILL = Block("05-fp8-prefill.patch", "fp8-prefill", "SOARPACK_FP8_PREFILL")
GLA_DECODE = Block("06-gla-decode-in-place.patch", "gla-decode", "SOARPACK_GLA_DECODE")
# The w4-dispatch names this module had before it served two blocks.
PATCH_NAME, BEGIN, END, ENV = W4_DISPATCH.patch, W4_DISPATCH.begin, W4_DISPATCH.end, W4_DISPATCH.env


def patch_path(directory: Optional[Path] = None, block: Block = W4_DISPATCH) -> Path:
    from soarpack.serve.patches import patch_dir

    path = Path(directory or patch_dir()) / block.patch
    if not path.is_file():
        raise ConfigError(f"{path} is missing", f"run from a soarpack checkout that has sglang/{block.patch}")
    return path


def block_source(patch: Optional[Path] = None, block: Block = W4_DISPATCH) -> str:
    """The block's text: the patch's added lines from the begin marker to the end marker."""
    path = Path(patch) if patch else patch_path(block=block)
    out, inside = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("+") or line.startswith("+++"):
            if inside and not line.startswith("+"):
                raise ConfigError(f"{path.name}: the {block.tag} block is interrupted by a context line",
                                  "the block must be added as one run of lines")
            continue
        text = line[1:]
        if text.startswith(block.begin):
            inside = True
        if inside:
            out.append(text)
        if text.startswith(block.end):
            break
    if not out or not out[-1].startswith(block.end):
        raise ConfigError(f"{path.name} holds no complete soarpack {block.tag} block", "check the patch file")
    return "\n".join(out) + "\n"


def file_block_source(path: Path, block: Block) -> str:
    """The block's text as a patched fork file has it (its lines from the begin marker to the end marker)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(block.begin)]
    ends = [i for i, line in enumerate(lines) if line.startswith(block.end)]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ConfigError(f"{path}: no single soarpack {block.tag} block", f"apply sglang/{block.patch} to the tree first")
    return "\n".join(lines[starts[0]:ends[0] + 1]) + "\n"


def load_block(block: Block, patch: Optional[Path] = None, env_value: Optional[str] = None,
               source: Optional[str] = None, more_env: Optional[Dict[str, Optional[str]]] = None) -> types.ModuleType:
    """The block as a module: the patch's text, or `source` (file_block_source of a patched tree's file).
    `env_value` is the text of `block.env` it reads at import (None: the environment's, as a server would);
    `more_env` sets other variables the same way (a source of two blocks reads both)."""
    module = types.ModuleType(block.module)
    source = block_source(patch, block) if source is None else source
    # Triton reads a @triton.jit function's source back from its file: the block must live in a .py file of its
    # own (the patch's lines carry "+" prefixes at other line numbers).
    where = Path(tempfile.mkdtemp(prefix=f"soarpack-{block.tag}-block-")) / f"{block.module}.py"
    where.write_text(source, encoding="utf-8")
    module.__file__ = str(where)
    env = {k: v for k, v in {block.env: env_value, **(more_env or {})}.items() if v is not None}
    saved = {k: os.environ.get(k) for k in env}
    try:
        os.environ.update(env)
        exec(compile(source, module.__file__, "exec", dont_inherit=True), module.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return module


def load_dispatch_block(patch: Optional[Path] = None, dispatch: Optional[str] = None, *, fp8: bool = False,
                        fp8_patch: Optional[Path] = None, fp8_spec: Optional[str] = None) -> types.ModuleType:
    """Patch 04's block, with patch 05's block after it when `fp8` (05 uses 04's names). `dispatch` / `fp8_spec` are
    the SOARPACK_W4_DISPATCH / SOARPACK_FP8_PREFILL texts they read at import (None: the environment's)."""
    if not fp8:
        return load_block(W4_DISPATCH, patch, dispatch)
    source = block_source(patch, W4_DISPATCH) + "\n\n" + block_source(fp8_patch, FP8_PREFILL)
    return load_block(W4_DISPATCH, env_value=dispatch, source=source, more_env={FP8_PREFILL.env: fp8_spec})


def load_gla_decode_block(patch: Optional[Path] = None, mode: Optional[str] = None) -> types.ModuleType:
    """Patch 06's block (needs triton). `mode` is the SOARPACK_GLA_DECODE text it reads at import."""
    return load_block(GLA_DECODE, patch, mode)
