"""A stand-in for the platform image's Python stack, built once into soarpack's cache.

The image runs its CPython with the OpenBMB fork installed as `python[all]`, so its venv holds the fork's own pins
(soarpack.facts.image: the Python, the pins and the fork's import packages, from which this builder reads them).
PyPI's torch of that pin is a CUDA build that imports and runs on a CPU; with its NVIDIA libraries it is a ~4 GB download,
which is why the venv is cached and reused. The venv is made without --system-site-packages, so nothing of this
machine's environment leaks into it. The fork's pure-Python import needs (what `soarpack serve-check` needs to
import the fork's model code on a CPU) are installed too: the image has them, as dependencies of `python[all]`.

A bundle that passes on this stack has been installed, imported and run the way the platform does it; one that
passed only on the development stack (this machine's Python and torch) has not.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional, Sequence

from soarpack import cachelock
from soarpack.errors import HostError, SoarpackError
from soarpack.facts import image
from soarpack.steps import EventCallback, lines_to, no_events

IMAGE_PINS = image.PIN_SPECS
FORK_IMPORT_PACKAGES = image.FORK_IMPORT_PACKAGES
PIP_ATTEMPTS = 3
# Printed by every interpreter that runs a rehearsal step, so a report names the stack that really ran.
VERSION_PROBE = (
    "import json, sys\n"
    "out = {'python': sys.version.split()[0]}\n"
    "for name in ('torch', 'transformers'):\n"
    "    try:\n"
    "        mod = __import__(name)\n"
    "        out[name] = mod.__version__\n"
    "    except Exception as exc:\n"
    "        out[name] = 'unimportable: ' + type(exc).__name__\n"
    "print(json.dumps(out))\n"
)


class ImageStackError(SoarpackError):
    """The stand-in for the image's Python stack could not be built."""


@dataclass(frozen=True)
class ImageStack:
    python: Path
    versions: Dict[str, str]

    def describe(self) -> str:
        return describe_versions(self.versions)


def describe_versions(versions: Dict[str, str]) -> str:
    return f"Python {versions.get('python')}, torch {versions.get('torch')}, transformers {versions.get('transformers')}"


def _uv_python310() -> str:
    """The CPython 3.10 that uv manages (`uv python find 3.10`), or "" when it has none."""
    try:
        out = subprocess.run(["uv", "python", "find", "3.10"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


# Where a CPython 3.10 is looked for, in this order (`soarpack env` shows which one was found and how).
PYTHON310_SEARCH = ("this interpreter", "$SOARPACK_PYTHON310", "python3.10 on PATH", "pyenv", "uv python find 3.10")


def _python310_candidates() -> Iterator[tuple]:
    if sys.version_info[:2] == (3, 10):
        yield PYTHON310_SEARCH[0], sys.executable
    yield PYTHON310_SEARCH[1], os.environ.get("SOARPACK_PYTHON310", "")
    yield PYTHON310_SEARCH[2], shutil.which("python3.10") or ""
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for p in sorted((str(p) for p in pyenv_root.glob("versions/3.10.*/bin/python3.10")), reverse=True):
        yield PYTHON310_SEARCH[3], p
    if shutil.which("uv"):
        yield PYTHON310_SEARCH[4], _uv_python310()


def _is_python310(cand: str) -> bool:
    try:
        out = subprocess.run([cand, "-c", "import sys; print(sys.version_info[:2] == (3, 10))"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and out.stdout.strip() == "True"


def locate_python310() -> Optional[tuple]:
    """(how it was found, path) of the CPython 3.10 soarpack uses, searched in PYTHON310_SEARCH's order; None."""
    for how, cand in _python310_candidates():
        if cand and _is_python310(cand):
            return how, cand
    return None


def find_python310() -> Optional[str]:
    """A CPython 3.10 (the platform's Python): this one if it is 3.10, $SOARPACK_PYTHON310, PATH, pyenv, uv."""
    found = locate_python310()
    return found[1] if found else None


def cache_root() -> Path:
    """$SOARPACK_CACHE, else $XDG_CACHE_HOME (or ~/.cache)/soarpack."""
    if os.environ.get("SOARPACK_CACHE"):
        return Path(os.environ["SOARPACK_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "soarpack"


def make_cache_dir(path: Path, what: str) -> Path:
    """Create a folder under the cache (wheels, the image stand-in); a read-only or missing HOME is one error line
    with the fix, not an OSError traceback. A top-level entry soarpack creates gets its marker (soarpack.cachemark:
    only marked entries are ever cleared); a folder that was already there is not marked."""
    from soarpack.cachemark import create_marked

    try:
        if path.parent == cache_root() and path.name != "image-stack":
            create_marked(path, path.name)
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HostError(f"cannot create the {what} folder {path} ({exc.strerror or exc})",
                              "point SOARPACK_CACHE at a writable folder (the cache is $SOARPACK_CACHE, else "
                              "$XDG_CACHE_HOME/soarpack, else ~/.cache/soarpack)") from None
    return path


def _spec(packages: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(packages)).encode()).hexdigest()[:12]


def stack_dir(packages: Sequence[str] = IMAGE_PINS + FORK_IMPORT_PACKAGES) -> Path:
    return cache_root() / "image-stack" / f"{image.PYTHON_TAG}-torch{image.TORCH}-{_spec(packages)}"


def clean_env(base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """An environment in which a Python sees only its own site-packages (no PYTHONPATH, PYTHONHOME, user site)."""
    env = dict(os.environ if base is None else base)
    for key in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONUSERBASE"):
        env.pop(key, None)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def probe_versions(python: os.PathLike, env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The Python, torch and transformers versions that `python` really imports."""
    proc = subprocess.run([str(python), "-c", VERSION_PROBE], capture_output=True, text=True, timeout=600,
                          env=env if env is not None else clean_env())
    if proc.returncode != 0:
        tail = " | ".join(proc.stderr.strip().splitlines()[-2:])
        raise ImageStackError(f"{python} does not run: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_dev_standin(dest: Path) -> Path:
    """The development stack's stand-in: a fresh venv that also sees this environment's site-packages, like the
    image's venv over its torch. Returns its python."""
    proc = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageStackError(f"cannot make a venv at {dest}: {proc.stderr.strip()[-300:]}")
    py = dest / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    dirs = []
    for d in [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]:
        if d not in dirs and Path(d).is_dir():
            dirs.append(d)
    Path(purelib, "_soarpack_host.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
    return py


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    make_cache_dir(path.parent, "image stand-in")
    try:
        fh = open(path, "w")
    except OSError as exc:
        raise HostError(f"cannot create the image stand-in's lock {path} ({exc.strerror or exc})",
                              "point SOARPACK_CACHE at a writable folder") from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


PIP_PROGRESS = ("Collecting", "Downloading", "Installing", "Successfully")


def _run_pip(cmd: Sequence[str], log: Callable[[str], None]) -> "tuple[int, str]":
    """Run pip; its progress lines (Collecting, Downloading, ...) become events, never this process's stderr. Returns
    the exit code and pip's last lines (for an error)."""
    tail: "collections.deque[str]" = collections.deque(maxlen=3)
    with subprocess.Popen(cmd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace") as proc:
        for line in proc.stdout:  # type: ignore[union-attr]
            line = line.strip()
            if line:
                tail.append(line)
                if line.startswith(PIP_PROGRESS):
                    log(f"pip: {line}")
    return proc.returncode, " | ".join(tail)


def _pip_install(python: Path, packages: Sequence[str], log: Callable[[str], None]) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--retries", "10", "--timeout", "120",
           *packages]
    last = ""
    for attempt in range(1, PIP_ATTEMPTS + 1):
        code, last = _run_pip(cmd, log)
        if code == 0:
            return
        if attempt < PIP_ATTEMPTS:
            log(f"pip install failed (attempt {attempt} of {PIP_ATTEMPTS}): {last}; retrying")
            time.sleep(5 * attempt)
    raise ImageStackError(f"installing the image stack failed after {PIP_ATTEMPTS} attempts: {last}",
                          "check the network to PyPI (about 4 GB is downloaded once), then run again")


def _ready(root: Path, marker: Path) -> Optional[ImageStack]:
    if marker.is_file():
        try:
            versions = json.loads(marker.read_text(encoding="utf-8"))["versions"]
            if (root / "bin" / "python").exists():
                return ImageStack(root / "bin" / "python", versions)
        except (OSError, ValueError, KeyError):
            pass
    return None


def ensure_image_stack(*, packages: Sequence[str] = IMAGE_PINS + FORK_IMPORT_PACKAGES,
                       on_event: EventCallback = no_events) -> ImageStack:
    """Return the cached stand-in, building it first if needed (once; ~4 GB from PyPI, a few minutes)."""
    log = lines_to(on_event, "image stand-in")
    root = stack_dir(packages)
    marker = root / ".soarpack-ready.json"
    # This process uses the stand-in until it exits: a shared lock keeps `soarpack cache clear` off it (a read-only
    # cache holds no lock and still serves; soarpack.cachelock).
    cachelock.hold_shared(root)
    ready = _ready(root, marker)
    if ready is not None:
        return ready
    cachelock.release_shared(root)  # the build takes the same lock exclusively
    with _locked(cachelock.lock_path(root)):
        stack = _ready(root, marker) or _build(root, marker, packages, log)
    cachelock.hold_shared(root)
    return stack


def _build(root: Path, marker: Path, packages: Sequence[str], log: Callable[[str], None]) -> ImageStack:
    py310 = find_python310()
    if py310 is None:
        raise ImageStackError("the image stand-in needs a CPython 3.10 (the platform's Python) and none was found",
                              "install one (pyenv install 3.10) or set SOARPACK_PYTHON310=/path/to/python3.10")
    log(f"building the image stand-in once (CPython 3.10, {', '.join(IMAGE_PINS)}; about 4 GB from PyPI) at {root}")
    shutil.rmtree(root, ignore_errors=True)
    from soarpack.cachemark import create_marked

    create_marked(root, f"image-stack/{root.name}")  # before the venv: an interrupted build is still ours to clear
    proc = subprocess.run([py310, "-m", "venv", str(root)], capture_output=True, text=True, env=clean_env())
    if proc.returncode != 0:
        raise ImageStackError(f"cannot make a Python 3.10 venv at {root}: {proc.stderr.strip()[-300:]}")
    python = root / "bin" / "python"
    t0 = time.monotonic()
    _pip_install(python, list(packages), log)
    versions = probe_versions(python)
    if not versions.get("torch", "").startswith(image.TORCH) or not versions.get("python", "").startswith(image.PYTHON + "."):
        raise ImageStackError(f"the image stand-in at {root} runs {describe_versions(versions)}, not the image's")
    marker.write_text(json.dumps({"packages": list(packages), "versions": versions,
                                  "seconds": round(time.monotonic() - t0, 1)}, indent=2), encoding="utf-8")
    log(f"image stand-in ready in {time.monotonic() - t0:.0f} s: {describe_versions(versions)}")
    return ImageStack(python, versions)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m soarpack.imagestack`: build (or find) the stand-in and print its python and versions."""
    try:
        stack = ensure_image_stack(on_event=lambda e: print(e.message, file=sys.stderr))
    except SoarpackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"python": str(stack.python), **stack.versions}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
