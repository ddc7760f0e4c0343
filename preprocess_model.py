"""soarpack preprocess_model.py: the platform's quantization step, run by prepare_model.sh.

    python preprocess_model.py --input ORIGINAL_SALA_DIR --output QUANTIZED_DIR

Validates both paths, then runs exactly `soarpack quantize` with the bundle's recipe and calibration data
(the same code path as a local run) and `soarpack verify` on the result, logging the time of every phase.
A recipe that quantizes nothing (MANIFEST quantize.method "none": the server quantizes at load, e.g. the fork's
`--quantization fp8`) makes the output the original itself, file for file: hard links where the filesystem allows,
copies elsewhere, then `soarpack verify --original` checks every byte.
Any failure ends with one line `preprocess_model: error: <cause>` and a non-zero exit. `soarpack quantize`
writes atomically, and the copy is renamed into place only when whole, so a failed run never leaves an output that
looks complete.

Only the standard library is imported here: a broken environment must still produce a readable cause.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUNDLE = Path(__file__).resolve().parent
PREFIX = "preprocess_model"


class Failure(Exception):
    pass


def log(msg: str) -> None:
    print(f"[{PREFIX} {time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


def load_manifest() -> dict:
    path = BUNDLE / "MANIFEST.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Failure(f"cannot read the bundle manifest {path}: {exc}") from exc
    except RecursionError:  # nested deeper than the parser recurses: no manifest soarpack writes
        raise Failure(f"cannot read the bundle manifest {path}: it is nested too deep to be a manifest") from None


def validate_input(path: Path) -> None:
    if not path.is_dir():
        raise Failure(f"--input {path} is not a directory")
    config_path = path / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Failure(f"--input {path} has no readable config.json ({exc})") from exc
    archs = config.get("architectures") or []
    if config.get("model_type") != "minicpm_sala" and "MiniCPMSALAForCausalLM" not in archs:
        raise Failure(f"--input {path} is not a MiniCPM-SALA checkpoint (model_type={config.get('model_type')!r})")
    if config.get("quantization_config"):
        raise Failure(f"--input {path} is already quantized (config.json has quantization_config)")
    if not any(path.glob("*.safetensors")):
        raise Failure(f"--input {path} holds no *.safetensors weights")


def validate_output(out: Path, inp: Path) -> bool:
    """Check the output path; return True when it exists with content (quantize then needs --force)."""
    out_r, inp_r = out.resolve(), inp.resolve()
    if out_r == inp_r:
        raise Failure("--output is the same directory as --input")
    if inp_r in out_r.parents:
        raise Failure(f"--output {out} lies inside --input {inp}")
    if out_r in inp_r.parents:
        raise Failure(f"--output {out} contains --input {inp}")
    if out.exists() and not out.is_dir():
        raise Failure(f"--output {out} exists and is not a directory")
    parent = out_r if out.exists() else out_r.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise Failure(f"--output {out} is not writable (no write permission on {parent})")
    return out.is_dir() and any(out.iterdir())


def run_phase(name: str, cmd: list[str], timings: dict) -> None:
    """Run one phase, streaming its output; on failure raise with its last error line as the cause."""
    log(f"phase {name}: {' '.join(cmd)}")
    t0 = time.monotonic()
    # Wide columns: rich would wrap the child's one-line cause over several lines otherwise.
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="400")
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, errors="replace")
    except OSError as exc:
        raise Failure(f"cannot start phase {name}: {exc}") from exc
    last_error = last_line = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        stripped = line.strip()
        if stripped:
            last_line = stripped
            if "error" in stripped.lower():
                last_error = stripped
    rc = proc.wait()
    timings[name] = round(time.monotonic() - t0, 1)
    log(f"phase {name}: {'ok' if rc == 0 else f'failed (exit {rc})'} in {timings[name]} s")
    if rc != 0:
        raise Failure(f"phase {name} failed (exit {rc}): {last_error or last_line or 'no output'}")


def quantize_command(manifest: dict, inp: Path, out: Path, force: bool) -> list[str]:
    quant = manifest.get("quantize") or {}
    recipe = quant.get("recipe")
    if not recipe:
        raise Failure("the bundle manifest names no recipe (quantize.recipe)")
    recipe_path = BUNDLE / recipe
    cmd = [sys.executable, "-m", "soarpack", "quantize", str(inp), str(out),
           "--recipe", str(recipe_path) if recipe_path.is_file() else recipe]
    for flag, key in (("--calib", "calib"), ("--held-out", "held_out")):
        for name in quant.get(key) or []:
            # The same rule as soarpack.bundle.manifest.bundle_path_problem (this script imports nothing of soarpack).
            if not isinstance(name, str) or os.path.isabs(name) or ".." in Path(name).parts:
                raise Failure(f"{key} entry {name!r} in the manifest is not a path inside the bundle")
            if not (BUNDLE / name).is_file():
                raise Failure(f"{key} file {name} listed in the manifest is missing from the bundle")
            cmd += [flag, str(BUNDLE / name)]
    cmd += [str(a) for a in quant.get("extra_args") or []]
    # Rehearsals (`soarpack check`) shrink the run on a tiny model; the platform never sets this.
    cmd += shlex.split(os.environ.get("SOARPACK_QUANTIZE_EXTRA", ""))
    cmd += ["--log", str(BUNDLE / "logs" / "quantize.log")]
    if force:
        cmd.append("--force")
    return cmd


def quantize_method(manifest: dict) -> str:
    """MANIFEST quantize.method: "gptq" (absent in bundles written before it) or "none"."""
    method = (manifest.get("quantize") or {}).get("method", "gptq")
    if method not in ("gptq", "none"):
        raise Failure(f"the bundle manifest's quantize.method {method!r} is neither gptq nor none")
    return method


def copy_original(inp: Path, out: Path) -> str:
    """The output as the original, file for file, renamed into place when whole (an existing output is replaced
    then). Hard links where --input and --output share a filesystem, copies elsewhere. Returns what was done."""
    out_r = out.resolve()
    out_r.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_r.name}.copy-", dir=out_r.parent))
    counts = {"linked": 0, "copied": 0}

    def place(src: str, dst: str) -> None:
        try:
            os.link(os.path.realpath(src), dst)
            counts["linked"] += 1
        except OSError:  # another filesystem, a read-only or link-refusing one: a copy
            shutil.copy2(src, dst)
            counts["copied"] += 1

    try:
        staged = tmp / "model"
        try:
            shutil.copytree(inp, staged, copy_function=place)  # symlinks followed: the files themselves
        except (OSError, shutil.Error) as exc:
            raise Failure(f"cannot copy {inp} to {out}: {exc}") from exc
        if out_r.exists():
            old = tmp / "replaced"
            os.rename(out_r, old)
        os.rename(staged, out_r)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"{counts['linked']} files hard-linked, {counts['copied']} copied"


def copy_phase(inp: Path, out: Path, timings: dict) -> None:
    log(f"phase copy: the recipe quantizes nothing (method none): {out} becomes {inp}, file for file")
    t0 = time.monotonic()
    done = copy_original(inp, out)
    timings["copy"] = round(time.monotonic() - t0, 1)
    log(f"phase copy: ok in {timings['copy']} s ({done})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="preprocess_model.py", description="Quantize MiniCPM-SALA with the bundle's recipe.")
    parser.add_argument("--input", required=True, type=Path, help="the original MiniCPM-SALA checkpoint")
    parser.add_argument("--output", required=True, type=Path, help="where the quantized checkpoint goes")
    parser.add_argument("--no-verify", action="store_true", help="skip `soarpack verify` on the result")
    args = parser.parse_args(argv)
    timings: dict = {}
    t0 = time.monotonic()
    try:
        manifest = load_manifest()
        validate_input(args.input)
        non_empty = validate_output(args.output, args.input)
        if non_empty:
            log(f"--output {args.output} is not empty: it is replaced atomically when quantization succeeds")
        timings["validate"] = round(time.monotonic() - t0, 1)
        log(f"phase validate: ok in {timings['validate']} s (soarpack {manifest.get('soarpack_version')}, profile {manifest.get('profile')})")
        (BUNDLE / "logs").mkdir(exist_ok=True)
        if quantize_method(manifest) == "gptq":
            run_phase("quantize", quantize_command(manifest, args.input, args.output, non_empty), timings)
            if not args.no_verify:
                # quantize already compared the checkpoint with the original before its atomic rename; this
                # re-checks the structure of what landed at --output (seconds, not the minutes of a per-module
                # comparison)
                run_phase("verify", [sys.executable, "-m", "soarpack", "verify", str(args.output)], timings)
        else:
            copy_phase(args.input, args.output, timings)
            if not args.no_verify:  # every file against the original, byte for byte (links are not read)
                run_phase("verify", [sys.executable, "-m", "soarpack", "verify", str(args.output),
                                     "--original", str(args.input)], timings)
    except Failure as exc:
        print(f"{PREFIX}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"{PREFIX}: error: interrupted", file=sys.stderr, flush=True)
        return 130
    log(f"done in {round(time.monotonic() - t0, 1)} s: " + ", ".join(f"{k} {v} s" for k, v in timings.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
