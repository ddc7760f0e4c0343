#!/usr/bin/env bash
# Install soarpack with its quantization stack and test tools into .venv (Python 3.11 here; 3.10 works too).
# torch is pinned first: an unpinned torch (or gptqmodel 7.7.0) would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "torch==2.13.0" -e ".[quant,dev,kernels]"  # dev: pytest and uv, the platform's installer, which check uses;
# kernels: triton and fla-core, for the Triton kernels' CPU tests (~190 MB download)
# The platform's Triton (torch 2.9.1's pin) in a folder of its own, for the test that compiles patch 06's kernel with
# it for the platform's sm_120 (tests/test_gla_decode.py; ~170 MB download). --no-deps: it needs nothing else.
[ -d .venv/triton-platform/triton ] || "${PIP[@]}" --no-deps --target .venv/triton-platform "triton==3.5.1"
# The versions, and the libraries' import-time warnings and banner counted into a log instead of shown.
.venv/bin/python scripts/import_check.py .venv/import-check.log
