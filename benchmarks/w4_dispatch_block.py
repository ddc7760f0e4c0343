"""Load the w4-dispatch code of a patched fork tree without importing the rest of SGLang.

Patch 04-w4-dispatch appends a self-contained block to the fork's `sglang/srt/layers/quantization/marlin_utils.py`,
between the lines `# --- soarpack w4-dispatch: begin` and `# --- soarpack w4-dispatch: end ---`. The rest of that
module imports the whole server stack (sgl_kernel, the fork's layers); the block needs only os, torch and triton.
`load_block(tree)` runs exactly the text of the patched file's block as a module, so a check on a machine without
the server stack exercises the code the server runs. Its Marlin route calls `torch.ops.sgl_kernel.gptq_marlin_gemm`:
whatever registered that op (sgl-kernel, or benchmarks/build_marlin_ext.py's extension) serves it.
"""

from __future__ import annotations

import __future__
import os
import types
from pathlib import Path
from typing import Optional

MARLIN_UTILS = "sglang/srt/layers/quantization/marlin_utils.py"
BEGIN = "# --- soarpack w4-dispatch: begin"
END = "# --- soarpack w4-dispatch: end ---"
FP8_BEGIN = "# --- soarpack fp8-prefill: begin"
FP8_END = "# --- soarpack fp8-prefill: end ---"


def block_text(marlin_utils: Path, begin: str = BEGIN, end: str = END) -> tuple:
    """(text, first line number) of the dispatch block (or, with FP8_BEGIN/FP8_END, patch 05's fp8-prefill block)
    in a patched marlin_utils.py."""
    lines = Path(marlin_utils).read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(begin)]
    ends = [i for i, line in enumerate(lines) if line.startswith(end)]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        what, patch = ("w4-dispatch", "04-w4-dispatch") if begin == BEGIN else ("fp8-prefill", "05-fp8-prefill")
        raise ValueError(f"{marlin_utils}: no single soarpack {what} block (is patch {patch} applied?)")
    return "".join(lines[starts[0]:ends[0] + 1]), starts[0] + 1


def _has_future_annotations(path: Path) -> bool:
    return any(line.strip() == "from __future__ import annotations" for line in path.read_text(encoding="utf-8").splitlines()[:40])


def load_block(tree: os.PathLike, env: Optional[dict] = None, fp8: bool = False) -> types.ModuleType:
    """The dispatch block of the patched fork tree `tree` (its python/ dir) as a module; with `fp8`, patch 05's
    fp8-prefill block too, after it, at its own line numbers.

    `env` temporarily sets environment variables while the blocks run (they read SOARPACK_W4_DISPATCH and
    SOARPACK_FP8_PREFILL once).
    """
    path = Path(tree) / MARLIN_UTILS
    text, first = block_text(path)
    if fp8:
        fp8_text, fp8_first = block_text(path, FP8_BEGIN, FP8_END)
        gap = fp8_first - first - text.count("\n")
        if gap < 0:
            raise ValueError(f"{path}: the fp8-prefill block does not come after the w4-dispatch block")
        text += "\n" * gap + fp8_text
    module = types.ModuleType("soarpack_w4_dispatch_block")
    module.__file__ = str(path)
    saved = {k: os.environ.get(k) for k in (env or {})}
    try:
        os.environ.update(env or {})
        # Compiled as the file compiles it: with its own `from __future__` flags only (line numbers kept).
        flags = __future__.annotations.compiler_flag if _has_future_annotations(path) else 0
        code = compile("\n" * (first - 1) + text, str(path), "exec", flags=flags, dont_inherit=True)
        exec(code, module.__dict__)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return module
