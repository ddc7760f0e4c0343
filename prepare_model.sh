#!/usr/bin/env bash
# soarpack prepare_model.sh: run by the SOAR platform as `bash prepare_model.sh --input ORIG --output OUT`
# after prepare_env.sh was sourced. It runs preprocess_model.py (validation, `soarpack quantize` with the
# bundle's recipe and calibration data, `soarpack verify`) with the overlay venv's python, logs to
# logs/prepare_model.log in the bundle and to stdout, and exits non-zero with a one-line cause on any failure.
set -uo pipefail

dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd) || { echo "prepare_model.sh: error: cannot locate the bundle" >&2; exit 1; }
mkdir -p "$dir/logs" || { echo "prepare_model.sh: error: cannot create $dir/logs" >&2; exit 1; }
log="$dir/logs/prepare_model.log"

py="${SOARPACK_PYTHON:-}"
[ -x "$py" ] || py="$dir/.soarpack/venv/bin/python"
if [ ! -x "$py" ]; then
    echo "prepare_model.sh: error: the quantization venv $py is missing (was prepare_env.sh sourced? see $dir/logs/prepare_env.log)" | tee -a "$log" >&2
    exit 1
fi

echo "[prepare_model.sh $(date -u +%H:%M:%S)] $py $dir/preprocess_model.py $*" | tee -a "$log"
start=$SECONDS
PYTHONUNBUFFERED=1 "$py" "$dir/preprocess_model.py" "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
echo "[prepare_model.sh $(date -u +%H:%M:%S)] exit $rc after $((SECONDS - start)) s" | tee -a "$log"
exit "$rc"
