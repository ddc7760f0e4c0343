"""The subprocesses `soarpack check` runs, each answering with data: sourcing prepare_env.sh in a shell that keeps
running, what the overlay venv holds and imports, an offline install of the bundle's wheels into CPython 3.10."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from soarpack.steps import StepFailed, StepSkipped


def tail(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def run(cmd: Sequence[str], *, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
        timeout: float = 1800) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
                              errors="replace")
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"{Path(cmd[0]).name} ran over {timeout:.0f} s", timeout_s=timeout) from exc


SOURCE_PROBE = r'''
source "$1/prepare_env.sh"
echo "__SP_RC=$?"
case "$-" in *e*) echo "__SP_ERREXIT=1";; esac
case "$-" in *u*) echo "__SP_NOUNSET=1";; esac
echo "__SP_ARGS=${SGLANG_SERVER_ARGS:-}"
echo "__SP_PY=${SOARPACK_PYTHON:-}"
echo "__SP_STATE=${SOARPACK_SGLANG_STATE:-}"
echo "__SP_ALIVE=1"
'''


def source_prepare_env(bundle: Path, env: Dict[str, str], cwd: Path) -> Dict[str, str]:
    """Source prepare_env.sh in `bash -c` that keeps running afterwards; return the probe's values."""
    proc = run(["bash", "--noprofile", "--norc", "-c", SOURCE_PROBE, "probe", str(bundle)], env=env, cwd=cwd)
    values = {}
    for line in proc.stdout.splitlines():
        if line.startswith("__SP_") and "=" in line:
            k, v = line[5:].split("=", 1)
            values[k] = v
    values["_stdout"], values["_stderr"], values["_rc"] = proc.stdout, proc.stderr, str(proc.returncode)
    return values


def overlay_lacks(py: str, wheel_names: List[str]) -> List[str]:
    """Wheels whose distribution is not installed in the overlay at the wheel's version."""
    from packaging.utils import parse_wheel_filename

    want = {}
    for name in wheel_names:
        dist, version, _, _ = parse_wheel_filename(name)
        want[str(dist)] = str(version)
    code = ("import json, sys, importlib.metadata as m\nout = {}\nfor n in json.loads(sys.argv[1]):\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: out[n] = None\nprint(json.dumps(out))")
    proc = run([py, "-c", code, json.dumps(sorted(want))])
    if proc.returncode != 0:
        raise StepFailed(f"the overlay python does not run: {tail(proc.stderr)}")
    got = json.loads(proc.stdout)
    return [f"{n} {v} (found {got.get(n)})" for n, v in sorted(want.items()) if got.get(n) != v]


# What prepare_model.sh needs to import in the overlay: the torchao break showed at exactly these imports.
OVERLAY_IMPORTS = "import gptqmodel, transformers.modeling_utils, soarpack.quant.run"
IMPORT_PROBE = ("import numpy, pcre, transformers, tokenizers, safetensors, typer, rich; "
                "print(numpy.__version__, transformers.__version__)")


def overlay_imports(overlay_py: str, env: Dict[str, str]) -> None:
    proc = run([overlay_py, "-c", OVERLAY_IMPORTS], env=dict(env, TRANSFORMERS_VERBOSITY="error"))
    if proc.returncode != 0:
        raise StepFailed(f"the overlay cannot import the quantization stack: {tail(proc.stderr, 1)}",
                         imports=OVERLAY_IMPORTS)


def wheels_on_python310(wheel_dir: Path, venv: Path) -> Dict[str, object]:
    """Install the bundle's wheels offline into a fresh CPython 3.10 venv; check the set is complete but for torch."""
    from soarpack.bundle.wheels import find_python310, pip_check_problems

    py310 = find_python310()
    if py310 is None:
        raise StepSkipped("no CPython 3.10 here (set SOARPACK_PYTHON310) to install the platform wheels into")
    proc = run([py310, "-m", "venv", str(venv)])
    if proc.returncode != 0:
        raise StepSkipped(f"cannot make a Python 3.10 venv: {tail(proc.stderr)}")
    py = str(venv / "bin" / "python")
    wheels = sorted(str(p) for p in wheel_dir.glob("*.whl"))
    proc = run([py, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-deps", *wheels])
    if proc.returncode != 0:
        raise StepFailed(f"offline install failed: {tail(proc.stderr or proc.stdout)}")
    proc = run([py, "-m", "pip", "check", "--disable-pip-version-check"])
    missing = pip_check_problems(proc.stdout)
    if missing:
        raise StepFailed("the wheel set is incomplete: " + "; ".join(missing[:5]), missing=missing)
    proc = run([py, "-c", IMPORT_PROBE], env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"))
    if proc.returncode != 0:
        raise StepFailed(f"import after install failed: {tail(proc.stderr)}")
    numpy_v, transformers_v = proc.stdout.split()[-2:]
    return {"wheels": len(wheels), "numpy": numpy_v, "transformers": transformers_v}
