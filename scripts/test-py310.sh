#!/usr/bin/env bash
# The platform runs Python 3.10. PyPI has no CPU build of torch for it (only multi-GB CUDA builds), so this leg
# installs soarpack's torch-free dependencies under 3.10, byte-compiles every module, and runs every test that
# does not need torch (tests/conftest.py leaves the others out when torch is missing, and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
PY310=${PY310:-}
if [ -z "$PY310" ]; then
  for cand in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10 /usr/bin/python3.10 /usr/local/bin/python3.10; do
    if [ -x "$cand" ] && "$cand" --version >/dev/null 2>&1; then PY310=$cand; break; fi
  done
fi
if [ -z "$PY310" ]; then
  echo "FAILED: no working Python 3.10 found (set PY310=/path/to/python3.10)" >&2
  exit 1
fi
echo "Python 3.10 leg with $("$PY310" --version)"
[ -x .venv310/bin/python ] || "$PY310" -m venv .venv310
.venv310/bin/python -m pip install -q typer rich httpx pydantic tomli jinja2 tokenizers safetensors huggingface_hub transformers pytest
.venv310/bin/python -m pip install -q --no-deps -e .
.venv310/bin/python -m compileall -q soarpack benchmarks tests preprocess_model.py
.venv310/bin/python -m pytest -q -p no:cacheprovider
