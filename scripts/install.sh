#!/usr/bin/env bash
# Install soarpack with its quantization stack and test tools into .venv (Python 3.11 here; 3.10 works too).
# torch is pinned first: an unpinned torch (or gptqmodel 7.7.0) would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q "torch==2.13.0" -e ".[quant,dev]"
.venv/bin/python -c "import torch, gptqmodel, soarpack; print('soarpack', soarpack.__version__, 'torch', torch.__version__, 'gptqmodel', gptqmodel.__version__)"
