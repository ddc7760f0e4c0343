"""`soarpack inspect --steps`: what the platform will run with a bundle, in order, read from the bundle itself.

Nothing is extracted or executed. The entry scripts, bundle.env and MANIFEST.json are read from the tarball:
- prepare_env.sh (sourced): the variables it exports, read as bash reads the script but never run
  (soarpack.bundle.shell_exports: quoting, here-documents, several assignments on a line, declare -x, bundle.env
  read in place), their values resolved where the script and bundle.env allow (a value the script computes at run
  time stays as the script writes it); the lines no reader can be sure of (eval, set -a, sourcing another file, ...)
  listed as lines it could not read; and its log;
- prepare_model.sh: the command it runs and its log; preprocess_model.py's phases, the `soarpack quantize` line it
  builds from MANIFEST.json (the same rule as its quantize_command: tests hold the two equal) and the logs it names;
- the server: the platform's launch line (soarpack.serve.server.launch_command) with the bundle's server args;
- then the platform's eval and speed bench, which the bundle does not control.

BUNDLE, ORIGINAL and QUANTIZED stand for the paths the platform chooses.
"""

from __future__ import annotations

import re
import shlex
import tarfile
import zlib
from pathlib import Path
from typing import Any, Dict, List

from soarpack.bundle import layout
from soarpack.bundle.manifest import MANIFEST_NAME, manifest_json, recipe_is_bundled
from soarpack.bundle.summary import _read_member  # the same member rules and size cap as `inspect`
from soarpack.errors import SoarpackError
from soarpack.printable import printable

BUNDLE, ORIGINAL, QUANTIZED = "BUNDLE", "ORIGINAL", "QUANTIZED"
WANTED = (MANIFEST_NAME, layout.BUNDLE_ENV, layout.PREPARE_ENV, layout.PREPARE_MODEL, layout.PREPROCESS)
PLATFORM_ARGS = "(the platform's SGLANG_SERVER_ARGS, kept; by default: {})"

_ASSIGN = re.compile(r"^\s*(?:local\s+|export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|[^\s;|&]*)\s*$")
_LOG_PATH = re.compile(r"logs/[\w.-]+\.log")  # in a value the script assigns: the log it writes
_PY_LOG = re.compile(r"\"logs\"\s*/\s*\"([\w.-]+\.log)\"")
_PHASE = re.compile(r"run_phase\(\"(\w+)\"")


def _read_members(path: Path) -> Dict[str, str]:
    found: Dict[str, str] = {}
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                if member.name in WANTED:
                    found[member.name] = _read_member(tar, member).decode("utf-8", "replace")
                    if len(found) == len(WANTED):
                        break
    except FileNotFoundError:
        raise SoarpackError(f"{path} does not exist", "pass the .tar.gz that `soarpack build` wrote") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise SoarpackError(f"cannot read {path} as a tarball: {exc}", "pass the .tar.gz that `soarpack build` wrote") from None
    missing = [name for name in WANTED if name not in found]
    if missing:
        raise SoarpackError(f"{path} lacks {', '.join(missing)}", "this is not a bundle written by `soarpack build`")
    return found


def parse_bundle_env(text: str) -> Dict[str, str]:
    """bundle.env's NAME=VALUE lines (shell-quoted by soarpack build)."""
    values = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            name, raw = line.split("=", 1)
            try:
                parts = shlex.split(raw)
            except ValueError:
                continue
            values[name.strip()] = " ".join(parts)
    return values


def script_exports(script: str, known: Dict[str, str], bundle_env: str = "") -> Dict[str, List[str]]:
    """{NAME: [value, ...]} of what sourcing the script exports (read_exports: several values when it exports a
    name on several paths); `bundle_env`: the text its `. "$dir/bundle.env"` reads."""
    return _read(script, known, bundle_env).values


def _read(script: str, known: Dict[str, str], bundle_env: str):
    from soarpack.bundle.shell_exports import read_exports

    def sourced(path: str):
        return bundle_env if path.endswith("/" + layout.BUNDLE_ENV) else None

    return read_exports(script, known, sourced=sourced)


def script_logs(script: str) -> List[str]:
    """The logs a shell script writes: the logs/NAME.log paths of its variable assignments (`log="$dir/logs/..."`)."""
    found = []
    for line in script.splitlines():
        match = _ASSIGN.match(line.split(" #", 1)[0])
        if match:
            found += [f"{BUNDLE}/{p}" for p in _LOG_PATH.findall(match.group(2)) if f"{BUNDLE}/{p}" not in found]
    return found


def quantize_line(manifest: Dict[str, Any]) -> List[str]:
    """The `soarpack quantize` command preprocess_model.py builds from MANIFEST.json (its quantize_command)."""
    quant = manifest.get("quantize") or {}
    recipe = str(quant.get("recipe"))
    cmd = ["$SOARPACK_PYTHON", "-m", "soarpack", "quantize", ORIGINAL, QUANTIZED, "--recipe",
           f"{BUNDLE}/{recipe}" if recipe_is_bundled(recipe) else recipe]
    for flag, key in (("--calib", "calib"), ("--held-out", "held_out")):
        for name in quant.get(key) or []:
            cmd += [flag, f"{BUNDLE}/{name}"]
    cmd += [str(a) for a in quant.get("extra_args") or []]
    cmd += ["--log", f"{BUNDLE}/logs/quantize.log"]
    return cmd


def platform_steps(path: str | Path) -> Dict[str, Any]:
    from soarpack.measure.evaluate import PLATFORM_MAX_TOKENS, PLATFORM_TIMEOUT_S
    from soarpack.measure.speed import TIER_CONCURRENCY
    from soarpack.serve.server import PLATFORM_PORT, READY_TIMEOUT_S, launch_command

    path = Path(path)
    files = _read_members(path)
    manifest = manifest_json(files[MANIFEST_NAME], str(path))
    env = parse_bundle_env(files[layout.BUNDLE_ENV])
    from soarpack.serve.server import PLATFORM_DEFAULT_ARGS

    known = {"dir": BUNDLE, "SGLANG_SERVER_ARGS": PLATFORM_ARGS.format(PLATFORM_DEFAULT_ARGS),
             "SOARPACK_IMAGE_PYTHON": "(the image's python)"}
    read = _read(files[layout.PREPARE_ENV], known, files[layout.BUNDLE_ENV])
    exports = read.values
    server_args = env.get("SOARPACK_BUNDLE_SERVER_ARGS", "")
    fallback = env.get("SOARPACK_BUNDLE_FALLBACK_ARGS", "")
    if "SGLANG_SERVER_ARGS" in exports:
        exports["SGLANG_SERVER_ARGS"] = [v + (" (fallback: when the SGLang patches do not install)"
                                              if v == fallback and fallback != server_args else "")
                                         for v in exports["SGLANG_SERVER_ARGS"]]
    phases = list(dict.fromkeys(_PHASE.findall(files[layout.PREPROCESS])))  # one run per phase, in code order
    runs = []
    if (manifest.get("quantize") or {}).get("method") == "none":  # a recipe that quantizes nothing: a copy
        phases = []
        runs = [{"phase": "copy", "command": f"(preprocess_model.py) {QUANTIZED} becomes {ORIGINAL}, file for file: "
                                             "hard links where the filesystem allows, else copies", "logs": []},
                {"phase": "verify", "command": f"$SOARPACK_PYTHON -m soarpack verify {QUANTIZED} --original {ORIGINAL}",
                 "logs": []}]
    for phase in phases:
        if phase == "quantize":
            runs.append({"phase": phase, "command": " ".join(quantize_line(manifest)),
                         "logs": [f"{BUNDLE}/logs/{name}" for name in _PY_LOG.findall(files[layout.PREPROCESS])]})
        elif phase == "verify":
            runs.append({"phase": phase, "command": f"$SOARPACK_PYTHON -m soarpack verify {QUANTIZED}", "logs": []})
        else:
            runs.append({"phase": phase, "command": "(see preprocess_model.py)", "logs": []})
    launch = launch_command(QUANTIZED, shlex.split(server_args), PLATFORM_PORT, python="python")
    return {
        "bundle": str(path),
        "profile": env.get("SOARPACK_BUNDLE_PROFILE"),
        "steps": [
            {"name": "prepare_env.sh", "command": f"source {BUNDLE}/{layout.PREPARE_ENV}",
             "note": "sourced by the platform's shell: its exports stay for the next steps",
             "exports": exports, "unread": [{"line": u.line, "text": u.text, "why": u.why} for u in read.unread],
             "logs": script_logs(files[layout.PREPARE_ENV])},
            {"name": "prepare_model.sh", "command": f"bash {BUNDLE}/{layout.PREPARE_MODEL} --input {ORIGINAL} --output {QUANTIZED}",
             "note": f"runs $SOARPACK_PYTHON {BUNDLE}/{layout.PREPROCESS} --input {ORIGINAL} --output {QUANTIZED}",
             "runs": runs, "logs": script_logs(files[layout.PREPARE_MODEL])},
            {"name": "server", "command": " ".join(shlex.quote(a) for a in launch),
             "note": f"the platform's launch line with SGLANG_SERVER_ARGS; flags after them win; ready within about "
                     f"{READY_TIMEOUT_S / 60:.0f} min", "logs": ["(the platform's server log; not written into the bundle)"]},
            {"name": "eval", "command": "the platform's eval_model.py: POST /v1/chat/completions per row, temperature 0, "
                                        f"max_tokens {PLATFORM_MAX_TOKENS}, timeout {PLATFORM_TIMEOUT_S:g} s",
             "note": "soarpack eval sends the same requests", "logs": ["(the platform's)"]},
            {"name": "bench", "command": "the platform's bench_serving.sh: python -m sglang.bench_serving --backend sglang "
                                         "--dataset-name custom --flush-cache, tiers " + ", ".join(
                                             f"{t} (--max-concurrency {c})" if c else f"{t} (no cap)" for t, c in TIER_CONCURRENCY.items()),
             "note": "soarpack bench runs the same tiers", "logs": ["(the platform's)"]},
        ],
    }


def render_steps(view: Dict[str, Any]) -> List[str]:
    lines = [f"what the platform runs with {view['bundle']} (profile {view['profile']}), in order; "
             f"{BUNDLE} is where it is unpacked, {ORIGINAL} and {QUANTIZED} the model folders it chooses"]
    for number, step in enumerate(view["steps"], 1):
        lines.append(f"{number}. {step['command']}")
        if step.get("note"):
            lines.append(f"   {step['note']}")
        for name, values in (step.get("exports") or {}).items():
            lines.append(f"   export {name}={values[0]}")
            lines += [f"   {' ' * (len(name) + 7)}or {v}" for v in values[1:]]
        for u in step.get("unread") or []:
            lines.append(f"   could not read line {u['line']}: {u['text']}  ({u['why']}; what it exports is not shown)")
        for run in step.get("runs") or []:
            lines.append(f"   {run['phase']}: {run['command']}")
            lines += [f"     log: {log}" for log in run["logs"]]
        for log in step.get("logs") or []:
            lines.append(f"   log: {log}")
    return [printable(line) for line in lines]  # the values and names come from the bundle: outside text


__all__ = ["platform_steps", "render_steps", "quantize_line", "script_exports", "script_logs", "parse_bundle_env"]
