# soarpack prepare_env.sh: SOURCED by the SOAR platform before prepare_model.sh and the SGLang server.
#
# Sourced, so its exports persist and any `exit` or `set -e` would kill the platform's own script: there is no
# set -e/-u, no exit, every step is guarded, everything lives in functions that are unset at the end, and the
# caller's shell options are untouched. Sourcing it twice is harmless (finished steps leave a marker and are
# skipped). It logs to logs/prepare_env.log in the bundle and to stdout.
#
# What it does:
#  1. Overlay venv for quantization in .soarpack/venv over the image's Python (`uv venv --system-site-packages`,
#     `python -m venv` when uv is missing). The image's packages live in a venv, which --system-site-packages
#     does not see, so a .pth file adds the image's site dirs behind the overlay's: torch comes from the image,
#     the bundled wheels (transformers 5, gptqmodel, numpy 2.2.6, ...) shadow it only inside the overlay.
#  2. Bundled wheels installed offline (--no-index --no-deps: the set is complete, nothing is resolved here);
#     soarpack itself is the bundle's source (src/), put on the overlay's path with a .pth: no build step.
#  3. SGLang: with the patch set (the default), the image's fork checkout, which the image installed editable,
#     is patched in place (all or nothing, already-applied patches skipped), so no reinstall is needed; when it is
#     read-only a patched copy is installed editable instead, as is a bundled patched tree (sglang/python). If
#     patching or installing fails the image's SGLang stays as it was and the profile's fallback args are
#     exported, loudly.
#  4. SGLANG_SERVER_ARGS: REPLACED by the profile's args, not appended to the platform's defaults. The profile
#     is one complete, linted set (attention backend, quantization, chunking ...); appending cannot remove a
#     default switch such as --dense-as-sparse, and duplicated flags depend on "last wins" parsing. The old value
#     is kept in SOARPACK_PLATFORM_SGLANG_SERVER_ARGS and logged.
#
# Knobs (environment, all optional): SOARPACK_IMAGE_PYTHON (the image's python), SOARPACK_SGLANG_FORK (the
# image's fork checkout), SOARPACK_SKIP_SGLANG=1 (leave SGLang alone) and SOARPACK_SKIP_WHEELS=1 (install
# no wheels); `soarpack check` uses the last two where its stand-in for the image cannot do what the image does.

_soarpack_log() {
    local line
    line="[soarpack prepare_env $(date -u +%H:%M:%S 2>/dev/null)] $*"
    printf '%s\n' "$line"
    [ -n "${_SP_LOG:-}" ] && printf '%s\n' "$line" >>"$_SP_LOG" 2>/dev/null
    return 0
}

# Run a command, its output to stdout and the log; return its status.
_soarpack_run() {
    _soarpack_log "run: $*"
    local rc
    if [ -n "${_SP_LOG:-}" ]; then
        "$@" 2>&1 | tee -a "$_SP_LOG"
        rc=${PIPESTATUS[0]}
    else
        "$@" 2>&1
        rc=$?
    fi
    [ "$rc" -ne 0 ] && _soarpack_log "command failed with status $rc: $1"
    return "$rc"
}

_soarpack_loud() {
    _soarpack_log "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    _soarpack_log "!!! $*"
    _soarpack_log "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
}

_soarpack_bundle_dir() {
    local src="${BASH_SOURCE[0]:-}"
    [ -z "$src" ] && src="$0"
    if [ -f "$src" ]; then
        (cd "$(dirname "$src")" 2>/dev/null && pwd)
    else
        pwd
    fi
}

_soarpack_find_image_python() {
    # The image's python is the one whose environment has torch (the server's venv); PATH first, then the
    # venvs beside the image's SGLang checkout. Falls back to the first python on PATH.
    local cand first=""
    for cand in "$(command -v python3 2>/dev/null)" "$(command -v python 2>/dev/null)" /opt/SGLang-MiniCPM-SALA/*/bin/python3 \
        /opt/SGLang-MiniCPM-SALA/*/*/bin/python3; do
        [ -x "$cand" ] || continue
        [ -z "$first" ] && first="$cand"
        if "$cand" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torch") is None)' >/dev/null 2>&1; then
            printf '%s\n' "$cand"
            return 0
        fi
    done
    printf '%s\n' "$first"
}

_soarpack_uv() {
    command -v uv >/dev/null 2>&1
}

_soarpack_make_overlay() {
    local venv="$1" image_py="$2" vpy site
    vpy="$venv/bin/python"
    if [ ! -x "$vpy" ]; then
        if _soarpack_uv; then
            _soarpack_run uv venv --system-site-packages --python "$image_py" "$venv" || return 1
        else
            _soarpack_run "$image_py" -m venv --system-site-packages "$venv" \
                || _soarpack_run "$image_py" -m venv --system-site-packages --without-pip "$venv" \
                || return 1
        fi
    fi
    [ -x "$vpy" ] || return 1
    site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null) || return 1
    # The image's site dirs, when its python is a venv (site.addsitedir also runs their .pth files, which is
    # how editable installs such as the image's SGLang are found).
    "$image_py" - "$site/_soarpack_image_site.pth" <<'PY' 2>>"${_SP_LOG:-/dev/null}" || return 1
import site, sys
dirs = [d for d in site.getsitepackages() if sys.prefix != sys.base_prefix]
with open(sys.argv[1], "w") as fh:
    for d in dirs:
        fh.write(f"import site; site.addsitedir({d!r})\n")
PY
    return 0
}

_soarpack_pip_install() {
    # _soarpack_pip_install PYTHON ARGS...: uv when present, else the target's pip, else the image's pip.
    local py="$1"
    shift
    if _soarpack_uv; then
        _soarpack_run uv pip install --python "$py" --offline "$@"
    elif "$py" -m pip --version >/dev/null 2>&1; then
        _soarpack_run "$py" -m pip install --disable-pip-version-check --no-warn-script-location "$@"
    else
        _soarpack_run "${_SP_IMAGE_PY}" -m pip --python "$py" install --disable-pip-version-check "$@"
    fi
}

_soarpack_install_wheels() {
    local dir="$1" vpy="$2" site
    local -a wheels=()
    local w
    site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null) || return 1
    # soarpack from the bundle's source; the name sorts before every other .pth so this copy wins.
    printf '%s\n' "$dir/src" >"$site/00_soarpack_src.pth" || return 1
    for w in "$dir"/wheels/*.whl; do
        [ -f "$w" ] && wheels+=("$w")
    done
    if [ "${SOARPACK_SKIP_WHEELS:-0}" = 1 ]; then
        _soarpack_log "SOARPACK_SKIP_WHEELS=1: ${#wheels[@]} bundled wheels not installed"
    elif [ "${#wheels[@]}" -gt 0 ]; then
        _soarpack_log "installing ${#wheels[@]} bundled wheels offline"
        _soarpack_pip_install "$vpy" --no-index --no-deps "${wheels[@]}" || return 1
    else
        _soarpack_log "no wheels in the bundle: the overlay relies on the image's packages"
    fi
    _soarpack_run "$vpy" -c 'import soarpack, sys; print("soarpack", soarpack.__version__, "from", soarpack.__file__, "on python", sys.version.split()[0])'
}

_soarpack_apply_patches() {
    # _soarpack_apply_patches VENV_PY SRC OUT: our patch set (the profile's patches) applied by the bundle's soarpack.
    local vpy="$1" src="$2" out="$3" p
    local -a sel=()
    for p in ${SOARPACK_BUNDLE_PATCHES:-}; do
        sel+=(--patch "$p")
    done
    SOARPACK_SGLANG_PATCHES="${_SP_DIR}/src/sglang" _soarpack_run "$vpy" -m soarpack.serve.patches apply \
        --src "$src" --out "$out" ${sel[@]+"${sel[@]}"}
}

_soarpack_sglang_origin() {
    # Where the image's python finds sglang, without importing it (find_spec does not run the package).
    "${_SP_IMAGE_PY}" -c 'import importlib.util as u; s = u.find_spec("sglang"); print(s.origin if s else "")' 2>/dev/null
}

_soarpack_install_sglang() {
    # Returns 0 when the patched SGLang is in place (or none is needed), 1 when the fallback args apply.
    local dir="$1" vpy="$2" mode="$3" fork tree origin
    case "$mode" in
        none)
            _soarpack_log "the profile needs no SGLang patches: the image's SGLang is used as is"
            return 0
            ;;
        tree)
            tree="$dir/sglang/python"
            ;;
        platform)
            fork="${SOARPACK_SGLANG_FORK:-/opt/SGLang-MiniCPM-SALA/packages/sglang-minicpm}"
            if [ ! -d "$fork/python/sglang" ]; then
                _soarpack_log "the image's SGLang fork is not at $fork (set SOARPACK_SGLANG_FORK)"
                return 1
            fi
            if [ -w "$fork/python/sglang" ]; then
                # In place: the image installed this checkout editable, so the server imports the patched files
                # with no reinstall (a reinstall would need build tools offline). All hunks are checked before a
                # byte is written; patches already applied are skipped, so a second run is a no-op.
                _soarpack_log "patching the image's fork in place at $fork/python"
                _soarpack_apply_patches "$vpy" "$fork/python" "$fork/python" || return 1
                return 0
            fi
            tree="$dir/.soarpack/sglang-python"
            if [ ! -f "$dir/.soarpack/sglang.applied" ]; then
                rm -rf "$tree" 2>/dev/null
                _soarpack_log "$fork is read-only: patching a copy at $tree"
                _soarpack_apply_patches "$vpy" "$fork/python" "$tree" || return 1
                : >"$dir/.soarpack/sglang.applied"
            fi
            ;;
        *)
            _soarpack_log "unknown SGLang mode '$mode' in bundle.env"
            return 1
            ;;
    esac
    if [ ! -d "$tree/sglang" ]; then
        _soarpack_log "no SGLang tree at $tree"
        return 1
    fi
    if [ -f "$dir/.soarpack/sglang.installed" ]; then
        _soarpack_log "patched SGLang already installed from $tree"
        return 0
    fi
    _soarpack_pip_install "${_SP_IMAGE_PY}" --no-deps --no-build-isolation -e "$tree" || return 1
    # The server must import the patched copy, not the image's checkout.
    origin=$(_soarpack_sglang_origin)
    _soarpack_log "sglang now from ${origin:-nowhere}"
    case "$origin" in
        "$tree"/*) ;;
        *) return 1 ;;
    esac
    : >"$dir/.soarpack/sglang.installed"
    return 0
}

_soarpack_prepare_env() {
    local dir venv vpy stamp want_stamp started
    started=$SECONDS
    dir=$(_soarpack_bundle_dir)
    _SP_DIR="$dir"
    mkdir -p "$dir/logs" "$dir/.soarpack" 2>/dev/null
    _SP_LOG="$dir/logs/prepare_env.log"
    _soarpack_log "bundle at $dir"

    # Values written by `soarpack build`: profile name, its server args and fallback args, SGLang mode.
    SOARPACK_BUNDLE_SERVER_ARGS=""
    SOARPACK_BUNDLE_FALLBACK_ARGS=""
    SOARPACK_BUNDLE_SGLANG="none"
    if [ -r "$dir/bundle.env" ]; then
        . "$dir/bundle.env"
    else
        _soarpack_loud "bundle.env is missing: SGLANG_SERVER_ARGS is left as the platform set it"
    fi

    _SP_IMAGE_PY="${SOARPACK_IMAGE_PYTHON:-}"
    [ -z "$_SP_IMAGE_PY" ] && _SP_IMAGE_PY=$(_soarpack_find_image_python)
    _soarpack_log "image python: ${_SP_IMAGE_PY:-none found}"

    venv="$dir/.soarpack/venv"
    vpy="$venv/bin/python"
    want_stamp=$(cksum <"$dir/MANIFEST.json" 2>/dev/null)
    stamp=$(cat "$venv/.soarpack-ready" 2>/dev/null)
    if [ -n "$want_stamp" ] && [ "$stamp" = "$want_stamp" ] && [ -x "$vpy" ]; then
        _soarpack_log "overlay venv already prepared at $venv"
    elif [ -z "$_SP_IMAGE_PY" ]; then
        _soarpack_loud "no python found: cannot build the quantization venv"
    elif _soarpack_make_overlay "$venv" "$_SP_IMAGE_PY" && _soarpack_install_wheels "$dir" "$vpy"; then
        printf '%s' "$want_stamp" >"$venv/.soarpack-ready" 2>/dev/null
        _soarpack_log "overlay venv ready at $venv"
    else
        _soarpack_loud "the quantization venv could not be prepared (see $_SP_LOG); prepare_model.sh will fail"
    fi
    export SOARPACK_BUNDLE_DIR="$dir"
    export SOARPACK_PYTHON="$vpy"

    if [ "${SGLANG_SERVER_ARGS+set}" = set ] && [ -z "${SOARPACK_PLATFORM_SGLANG_SERVER_ARGS+set}" ]; then
        export SOARPACK_PLATFORM_SGLANG_SERVER_ARGS="$SGLANG_SERVER_ARGS"
        _soarpack_log "platform default SGLANG_SERVER_ARGS (replaced): $SGLANG_SERVER_ARGS"
    fi
    if [ "${SOARPACK_SKIP_SGLANG:-0}" = 1 ]; then
        _soarpack_log "SOARPACK_SKIP_SGLANG=1: SGLang left as it is"
        [ -n "$SOARPACK_BUNDLE_SERVER_ARGS" ] && export SGLANG_SERVER_ARGS="$SOARPACK_BUNDLE_SERVER_ARGS"
    elif _soarpack_install_sglang "$dir" "$vpy" "$SOARPACK_BUNDLE_SGLANG"; then
        [ -n "$SOARPACK_BUNDLE_SERVER_ARGS" ] && export SGLANG_SERVER_ARGS="$SOARPACK_BUNDLE_SERVER_ARGS"
        export SOARPACK_SGLANG_STATE="patched:$SOARPACK_BUNDLE_SGLANG"
    else
        _soarpack_loud "SGLang patches NOT installed: the image's SGLang stays and the FALLBACK server args apply"
        [ -n "$SOARPACK_BUNDLE_FALLBACK_ARGS" ] && export SGLANG_SERVER_ARGS="$SOARPACK_BUNDLE_FALLBACK_ARGS"
        export SOARPACK_SGLANG_STATE="fallback"
    fi
    _soarpack_log "SGLANG_SERVER_ARGS=${SGLANG_SERVER_ARGS:-}"
    _soarpack_log "done in $((SECONDS - started)) s"
    return 0
}

# Called in a condition so that even a caller running under `set -e` cannot be stopped by a failing step.
_soarpack_prepare_env || true
unset -f _soarpack_log _soarpack_run _soarpack_loud _soarpack_bundle_dir _soarpack_find_image_python _soarpack_uv _soarpack_make_overlay \
    _soarpack_pip_install _soarpack_install_wheels _soarpack_apply_patches _soarpack_sglang_origin _soarpack_install_sglang \
    _soarpack_prepare_env
unset _SP_LOG _SP_IMAGE_PY _SP_DIR
true
