"""The last step of scripts/install.sh: import the quantization stack once and print its versions, with the
libraries' import-time output (torchao's `Failed to load ...so`, torch's W lines, GPTQModel's banner) sent to LOG
and counted, as `soarpack quantize` does: `N library warnings: LOG`.

Usage: python scripts/import_check.py LOG
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(log: Path) -> int:
    from soarpack.quant.capture import library_output_to

    os.environ.setdefault("GPTQMODEL_DISABLE_GIL_WARNING", "1")  # GPTQModel's own switch (see soarpack.quant.engine)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("", encoding="utf-8")
    try:
        with library_output_to(log) as captured:
            import gptqmodel
            import torch
    except Exception as exc:  # the libraries' own lines about it are in the log
        print(f"error: importing the quantization stack failed: {type(exc).__name__}: {exc} (its output: {log})",
              file=sys.stderr)
        return 1
    import soarpack

    print("soarpack", soarpack.__version__, "torch", torch.__version__, "gptqmodel", gptqmodel.__version__)
    print(captured.line())
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    sys.exit(main(Path(sys.argv[1])))
