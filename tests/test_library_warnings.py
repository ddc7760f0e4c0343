"""Issue 27 item 3: which lines of a log count as a library's warning (soarpack.quant.capture), each shape taken
from a real quantize log (torchao 0.x, torch 2.13, GPTQModel 7.6.0, transformers 5)."""

from __future__ import annotations

import os
import sys

from soarpack.quant.capture import Captured, count_library_warnings, library_output_to

WARNINGS = [
    "Failed to load /v/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so: Could not load this library",
    "W1201 12:02:37.464000 24217 torch/utils/_pytree.py:630] <enum 'KernelPreference'> is an Enum subclass ...",
    "WARN  Python GIL is enabled: Multi-gpu quant acceleration for MoE models is sub-optimal ...",
    "/v/transformers/configuration_utils.py:726: FutureWarning: `rope_scaling` is deprecated",
    "Quantizing mlp.up_proj in layer [0 of 3] ▊░░| 0:00:00 / 0:00:00 [1/4] 25.0%WARN  Calibration dataset size ...",
    "E1201 12:02:37.464000 24217 torch/_dynamo/x.py:1] something failed",
]
NOT_WARNINGS = [
    "INFO  ENV: Auto setting CUDA_DEVICE_ORDER=PCI_BUS_ID for correctness.",
    "│ GPT-QModel  │ -> │ ▓▓▓▓▓▓▓▓▓▓▓▓ 16bit     │ -> │ ▒▒▒▒ 8bit  │ -> │ ░░ 4bit │",
    "  warnings.warn(",
    "2026-12-01 12:06:28 gptq layer 1/2 started after 0.1s, eta 0s",
    "2026-12-01 12:06:28 note: WARN  looks like a library line but is soarpack's own, timestamped",
    "INFO  | region     | count | last_s | avg_s | total_s | pct    | source  |",
]


def test_each_known_shape_counts_once_and_nothing_else_does():
    assert count_library_warnings(WARNINGS) == len(WARNINGS)
    assert count_library_warnings(NOT_WARNINGS) == 0


def test_the_capture_counts_only_what_the_block_wrote(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("WARN  from an earlier run\n")
    with library_output_to(log) as captured:
        print("W1201 12:02:37.464000 1 torch/utils/_pytree.py:630] x")
        sys.stderr.write("Failed to load /x/torchao/_C_cutlass_90a.abi3.so: nope\n")
        os.write(2, b"WARN  written to fd 2 by C code\n")
        print("INFO  fine")
    assert captured.warnings == 3
    assert captured.line() == f"3 library warnings: {log}"
    assert Captured(log, 1).line() == f"1 library warning: {log}"
    assert "from an earlier run" in log.read_text() and "fd 2 by C code" in log.read_text()
