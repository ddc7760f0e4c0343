"""`soarpack check`: rehearse what the platform does with a bundle before an upload is spent.

Static steps: safe extraction, size, structure and manifest, credentials, wheel tags, `bash -n`, args lint.
Rehearsal in a temp dir, by default on a stand-in for the image's Python stack (CPython 3.10 with the fork's pins:
torch 2.9.1, torchao 0.9.0, transformers 4.57.1; see imagestack.py) that sees nothing of this machine's
site-packages: source prepare_env.sh with it as the image's python (the bundle's own wheels go into the overlay
offline, with uv when it is on PATH), `bash prepare_model.sh` on a tiny SALA model, `soarpack verify` on the result.
Each step that ran an interpreter records the Python, torch and transformers versions that interpreter reported.
`dev_stack=True` rehearses over this environment instead (fast, for tests): its report says so and is never
"uploadable". What needs the real image or a GPU is reported as skipped, with the reason.
"""

from __future__ import annotations

import json
import os
import py_compile
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

from soarpack.bundle import layout
from soarpack.bundle.manifest import bundle_path_problem, read_manifest, verify_files
from soarpack.bundle.secrets import scan_tree
from soarpack.bundle.tarpack import safe_extract
from soarpack.errors import HostError, SoarpackError
from soarpack.fsutil import ensure_writable_output

PASS, FAIL, SKIP = "pass", "fail", "skip"
PLATFORM_DEFAULT_ARGS = ("--disable-radix-cache --attention-backend minicpm_flashinfer --chunked-prefill-size 8192 "
                         "--skip-server-warmup --dense-as-sparse")
# A tiny quantization run: enough rows for GPTQ's Hessians on the tiny model, minutes not hours on a CPU.
REHEARSAL_QUANTIZE = "--rows 16 --max-len 128 --device cpu --no-report"


class StepFailed(Exception):
    pass


class StepSkipped(Exception):
    pass


IMAGE_STACK, DEV_STACK = "image stack", "development stack"
# The steps that must have passed for a bundle to be called uploadable (the rest may skip with a reason).
REHEARSED = ("prepare_env.sh", "bundled wheels", "prepare_model.sh", "verify")


@dataclass
class Step:
    name: str
    status: str
    detail: str = ""
    seconds: float = 0.0
    versions: Optional[Dict[str, str]] = None  # what the interpreter that ran the step reported


@dataclass
class CheckReport:
    bundle: str
    steps: List[Step] = field(default_factory=list)
    stack: str = IMAGE_STACK

    @property
    def ok(self) -> bool:
        return all(s.status != FAIL for s in self.steps)

    @property
    def not_uploadable_because(self) -> Optional[str]:
        """None when the bundle did on the image's stack all that the platform does before the server starts."""
        failed = [s.name for s in self.steps if s.status == FAIL]
        if failed:
            return f"failed: {', '.join(failed)}"
        status = {s.name: s.status for s in self.steps}
        not_run = [name for name in REHEARSED if status.get(name) != PASS]
        if not_run:
            return f"not rehearsed: {', '.join(not_run)}"
        if self.stack != IMAGE_STACK:
            return "rehearsed on the development stack, not the image's (CPython 3.10, torch 2.9.1)"
        return None

    @property
    def uploadable(self) -> bool:
        return self.not_uploadable_because is None

    def to_dict(self) -> Dict[str, Any]:
        return {"bundle": self.bundle, "ok": self.ok, "stack": self.stack, "uploadable": self.uploadable,
                "not_uploadable_because": self.not_uploadable_because, "steps": [asdict(s) for s in self.steps]}


class _Runner:
    def __init__(self, report: CheckReport, log: Callable[[Step], None],
                 started: Callable[[str], None] = lambda name: None):
        self.report, self.log, self.started = report, log, started

    @contextmanager
    def step(self, name: str) -> Iterator[Dict[str, Any]]:
        self.started(name)
        info: Dict[str, Any] = {"detail": "", "versions": None}
        t0 = time.monotonic()
        status = PASS
        try:
            yield info
        except StepSkipped as exc:
            status, info["detail"] = SKIP, str(exc)
        except StepFailed as exc:
            status, info["detail"] = FAIL, str(exc)
        except HostError:
            raise  # this machine cannot run the step (e.g. a read-only cache): not the bundle's failure
        except SoarpackError as exc:
            status, info["detail"] = FAIL, str(exc)
        step = Step(name, status, info["detail"], round(time.monotonic() - t0, 2), info["versions"])
        self.report.steps.append(step)
        self.log(step)

    def skip(self, name: str, reason: str) -> None:
        step = Step(name, SKIP, reason)
        self.report.steps.append(step)
        self.log(step)

    def failed(self, name: str) -> bool:
        return any(s.name == name and s.status == FAIL for s in self.report.steps)


def _tail(text: str, n: int = 3) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def _run(cmd: List[str], *, env: Optional[Dict[str, str]] = None, cwd: Optional[Path] = None,
         timeout: float = 1800) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"{Path(cmd[0]).name} ran over {timeout:.0f} s") from exc


# -- static steps ----------------------------------------------------------------------------------------------


def _structure(root: Path) -> Dict[str, Any]:
    missing = [name for name in layout.REQUIRED if not (root / name).is_file()]
    if missing:
        raise StepFailed("missing: " + ", ".join(missing))
    manifest = read_manifest(root)
    problems = verify_files(root, manifest)
    if problems:
        raise StepFailed(f"{len(problems)} file(s) disagree with MANIFEST.json: " + "; ".join(problems[:5]))
    quant = manifest.get("quantize") or {}
    if not quant.get("recipe"):
        raise StepFailed("MANIFEST.json names no recipe")
    for calib in quant.get("calib") or []:
        problem = bundle_path_problem(calib)
        if problem:
            raise StepFailed(f"calibration entry {calib!r} {problem}")
        if not (root / calib).is_file():
            raise StepFailed(f"calibration file {calib} is missing")
    wheels = (manifest.get("wheels") or {}).get("files") or []
    present = sorted(p.name for p in (root / layout.WHEELS_DIR).glob("*.whl"))
    if sorted(wheels) != present:
        raise StepFailed("wheels/ does not match the manifest's wheel list")
    return manifest


def wheel_tag_problems(names: List[str]) -> List[str]:
    """Wheels that CPython 3.10 on manylinux x86_64 (the platform) cannot install."""
    from packaging.utils import parse_wheel_filename

    from soarpack.bundle.wheels import platform_tags

    target = platform_tags()
    bad = []
    for name in names:
        try:
            _, _, _, tags = parse_wheel_filename(name)
        except Exception:
            bad.append(f"{name}: not a wheel file name")
            continue
        if not set(tags) & target:
            bad.append(f"{name}: no tag for CPython 3.10 manylinux x86_64")
    return bad


def _installable_here(wheel_names: List[str]) -> Optional[str]:
    """None when this interpreter can install every wheel; else why not."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    here = set(sys_tags())
    for name in wheel_names:
        _, _, _, tags = parse_wheel_filename(name)
        if not set(tags) & here:
            return (f"{name} is for the platform (CPython 3.10 manylinux x86_64), not this CPython "
                    f"{sys.version_info[0]}.{sys.version_info[1]}; the platform installs them")
    return None


def _lint(manifest: Dict[str, Any], root: Path) -> str:
    from soarpack.serve.lint import lint_args

    prof = manifest.get("profile") or {}
    quant = manifest.get("quantize") or {}
    recipe = quant.get("recipe")
    if recipe and (root / recipe).is_file():
        recipe = root / recipe
    patched = set(prof.get("patches") or []) if (manifest.get("sglang") or {}).get("mode") in ("platform", "tree") else set()
    findings = lint_args(prof.get("args") or [], recipe=recipe, patched=patched)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise StepFailed("; ".join(f"{f.rule}: {f.message}" for f in errors))
    return "; ".join(f"{f.level} {f.rule}" for f in findings) or "no findings"


# -- rehearsal -------------------------------------------------------------------------------------------------


def make_dev_standin(dest: Path) -> Path:
    """A fresh venv that also sees this environment's site-packages, like the image's venv over its torch."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(dest)]).check_returncode()
    py = dest / "bin" / "python"
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    dirs = []
    for d in [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]:
        if d not in dirs and Path(d).is_dir():
            dirs.append(d)
    Path(purelib, "_soarpack_host.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
    return py


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
    proc = _run(["bash", "--noprofile", "--norc", "-c", SOURCE_PROBE, "probe", str(bundle)], env=env, cwd=cwd)
    values = {}
    for line in proc.stdout.splitlines():
        if line.startswith("__SP_") and "=" in line:
            k, v = line[5:].split("=", 1)
            values[k] = v
    values["_stdout"], values["_stderr"], values["_rc"] = proc.stdout, proc.stderr, str(proc.returncode)
    return values


def _overlay_has(py: str, wheel_names: List[str]) -> List[str]:
    """Wheels whose distribution is not installed in the overlay at the wheel's version."""
    from packaging.utils import parse_wheel_filename

    want = {}
    for name in wheel_names:
        dist, version, _, _ = parse_wheel_filename(name)
        want[str(dist)] = str(version)
    code = ("import json, sys, importlib.metadata as m\nout = {}\nfor n in json.loads(sys.argv[1]):\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: out[n] = None\nprint(json.dumps(out))")
    proc = _run([py, "-c", code, json.dumps(sorted(want))])
    if proc.returncode != 0:
        raise StepFailed(f"the overlay python does not run: {_tail(proc.stderr)}")
    got = json.loads(proc.stdout)
    return [f"{n} {v} (found {got.get(n)})" for n, v in sorted(want.items()) if got.get(n) != v]


IMPORT_PROBE = "import numpy, pcre, transformers, tokenizers, safetensors, typer, rich; print(numpy.__version__, transformers.__version__)"
# What prepare_model.sh needs to import in the overlay: the torchao break showed at exactly these imports.
OVERLAY_IMPORTS = "import gptqmodel, transformers.modeling_utils, soarpack.quant.run"


def wheels_on_python310(wheel_dir: Path, venv: Path) -> str:
    """Install the bundle's wheels offline into a fresh CPython 3.10 venv; check the set is complete but for torch."""
    from soarpack.bundle.wheels import find_python310, pip_check_problems

    py310 = find_python310()
    if py310 is None:
        raise StepSkipped("no CPython 3.10 here (set SOARPACK_PYTHON310) to install the platform wheels into")
    proc = _run([py310, "-m", "venv", str(venv)])
    if proc.returncode != 0:
        raise StepSkipped(f"cannot make a Python 3.10 venv: {_tail(proc.stderr)}")
    py = str(venv / "bin" / "python")
    wheels = sorted(str(p) for p in wheel_dir.glob("*.whl"))
    proc = _run([py, "-m", "pip", "install", "--disable-pip-version-check", "--no-index", "--no-deps", *wheels])
    if proc.returncode != 0:
        raise StepFailed(f"offline install failed: {_tail(proc.stderr or proc.stdout)}")
    proc = _run([py, "-m", "pip", "check", "--disable-pip-version-check"])
    missing = pip_check_problems(proc.stdout)
    if missing:
        raise StepFailed("the wheel set is incomplete: " + "; ".join(missing[:5]))
    proc = _run([py, "-c", IMPORT_PROBE], env=dict(os.environ, TRANSFORMERS_VERBOSITY="error"))
    if proc.returncode != 0:
        raise StepFailed(f"import after install failed: {_tail(proc.stderr)}")
    numpy_v, transformers_v = proc.stdout.split()[-2:]
    return (f"{len(wheels)} wheels installed offline (--no-index --no-deps) into a fresh CPython 3.10 venv; complete but "
            f"for torch (the image's); numpy {numpy_v}, transformers {transformers_v}, pcre import")


def check_bundle(
    bundle: os.PathLike,
    *,
    rehearse: bool = True,
    sglang_fork: Optional[os.PathLike] = None,
    work_dir: Optional[os.PathLike] = None,
    keep: bool = False,
    quantize_args: str = REHEARSAL_QUANTIZE,
    dev_stack: bool = False,
    log: Callable[[Step], None] = lambda step: None,
    note: Callable[[str], None] = lambda message: None,
    started: Callable[[str], None] = lambda name: None,
) -> CheckReport:
    """Run every check and the rehearsal; each step passes, fails or is skipped with its reason.

    note: one-off messages while a step runs (building the image stand-in the first time).
    started: called with a step's name when it starts (`log` gets the step when it ends).
    """
    bundle = Path(bundle)
    if sglang_fork is not None:
        from soarpack.serve.patches import resolve_src

        resolve_src(sglang_fork)  # not a fork checkout: say so now, not as a crash in the rehearsal
    report = CheckReport(str(bundle), stack=DEV_STACK if dev_stack else IMAGE_STACK)
    r = _Runner(report, log, started)
    tmp_obj = None
    if work_dir is None:
        tmp_obj = tempfile.TemporaryDirectory(prefix="soarpack-check-")
        work = Path(tmp_obj.name)
    else:
        work = Path(work_dir)
        if work.exists() and not work.is_dir():
            raise SoarpackError(f"--keep {work} is a file", "pass a new or empty folder to --keep")
        if work.exists() and any(work.iterdir()):
            raise SoarpackError(f"rehearsal folder {work} is not empty", "pass a new or empty folder to --keep")
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SoarpackError(f"--keep {work} cannot be created ({exc.strerror or exc})",
                                "pass a folder on a writable disk to --keep, or leave --keep out") from None
        ensure_writable_output(work / "bundle", what="--keep folder")
    root = work / "bundle"
    try:
        with r.step("size") as s:
            if not bundle.is_file():
                raise StepFailed(f"{bundle} is not a file")
            size = bundle.stat().st_size
            if size > layout.MAX_BYTES:
                raise StepFailed(f"{size / 1e9:.2f} GB is over the platform's 2 GB limit")
            s["detail"] = f"{size / 1e6:.1f} MB of {layout.MAX_BYTES / 1e9:.1f} GB" + (" (close to the limit)" if size > layout.WARN_BYTES else "")
        if r.failed("size"):
            return report
        with r.step("extract") as s:
            safe_extract(bundle, root)
            s["detail"] = f"{sum(1 for _ in root.rglob('*'))} entries, every member inside the tree"
        if r.failed("extract"):
            return report
        manifest: Dict[str, Any] = {}
        with r.step("structure") as s:
            manifest = _structure(root)
            s["detail"] = f"{len(manifest['files'])} files match MANIFEST.json (soarpack {manifest.get('soarpack_version')})"
        with r.step("credentials") as s:
            scan_tree(root)
            s["detail"] = "no credential-looking file"
        wheel_names = sorted(p.name for p in (root / layout.WHEELS_DIR).glob("*.whl"))
        with r.step("wheel tags") as s:
            if not wheel_names:
                raise StepSkipped("no wheels in the bundle (built with --no-wheels)")
            bad = wheel_tag_problems(wheel_names)
            if bad:
                raise StepFailed("; ".join(bad[:5]))
            s["detail"] = f"{len(wheel_names)} wheels installable on CPython 3.10 manylinux x86_64"
        with r.step("scripts syntax") as s:
            for name in (layout.PREPARE_ENV, layout.PREPARE_MODEL):
                proc = _run(["bash", "-n", str(root / name)])
                if proc.returncode != 0:
                    raise StepFailed(f"bash -n {name}: {_tail(proc.stderr)}")
            try:
                py_compile.compile(str(root / layout.PREPROCESS), cfile=str(work / "preprocess.pyc"), doraise=True)
            except py_compile.PyCompileError as exc:
                raise StepFailed(f"{layout.PREPROCESS}: {exc.msg}") from None
            text = (root / layout.PREPARE_ENV).read_text()
            code_lines = [ln.split("#", 1)[0] for ln in text.splitlines()]
            if any(tok in ln.split() for ln in code_lines for tok in ("exit",)) or any("set -e" in ln or "set -u" in ln for ln in code_lines):
                raise StepFailed("prepare_env.sh uses exit, set -e or set -u: sourcing it could stop the platform's script")
            s["detail"] = "bash -n on both scripts, preprocess_model.py compiles, prepare_env.sh has no exit/set -e"
        with r.step("args lint") as s:
            if not manifest:
                raise StepSkipped("no manifest")
            s["detail"] = _lint(manifest, root)

        if not rehearse:
            r.skip("rehearsal", "--no-rehearse")
            return report
        if any(st.status == FAIL for st in report.steps):
            r.skip("rehearsal", "an earlier step failed")
            return report
        _rehearse(r, root, work, manifest, wheel_names, sglang_fork, quantize_args, dev_stack, note)
        return report
    finally:
        if tmp_obj is not None and not keep:
            tmp_obj.cleanup()


def _standin(r: _Runner, work: Path, dev_stack: bool, note: Callable[[str], None]) -> Optional[Path]:
    """The image's python for the rehearsal: the cached image stack, or a venv over this environment."""
    from soarpack.imagestack import ensure_image_stack, probe_versions

    image_py: Optional[Path] = None
    with r.step("image stand-in") as s:
        if dev_stack:
            image_py = make_dev_standin(work / "image")
            s["detail"] = f"{DEV_STACK}: a venv at {work / 'image'} over this environment's packages"
        else:
            image_py = ensure_image_stack(log=note).python
            s["detail"] = f"{IMAGE_STACK}: CPython 3.10 with the fork's pins, cached at {image_py.parent.parent}"
        s["versions"] = probe_versions(image_py, env=_rehearsal_env(image_py, dev_stack))
    return image_py


def _rehearsal_env(image_py: Path, dev_stack: bool) -> Dict[str, str]:
    from soarpack.imagestack import clean_env

    # On the image stack nothing of this environment may leak in (PYTHONPATH above all).
    env = dict(os.environ) if dev_stack else clean_env()
    for key in ("SOARPACK_PYTHON", "SOARPACK_PLATFORM_SGLANG_SERVER_ARGS", "SOARPACK_SKIP_WHEELS", "SOARPACK_SKIP_SGLANG"):
        env.pop(key, None)
    env.update({"SOARPACK_IMAGE_PYTHON": str(image_py), "SGLANG_SERVER_ARGS": PLATFORM_DEFAULT_ARGS,
                "PATH": f"{image_py.parent}{os.pathsep}{env.get('PATH', '')}", "VIRTUAL_ENV": str(image_py.parent.parent)})
    return env


def _overlay_imports(overlay_py: str, env: Dict[str, str]) -> None:
    proc = _run([overlay_py, "-c", OVERLAY_IMPORTS], env=dict(env, TRANSFORMERS_VERBOSITY="error"))
    if proc.returncode != 0:
        raise StepFailed(f"the overlay cannot import the quantization stack: {_tail(proc.stderr, 1)}")


def _rehearse(r: _Runner, root: Path, work: Path, manifest: Dict[str, Any], wheel_names: List[str],
              sglang_fork: Optional[os.PathLike], quantize_args: str, dev_stack: bool,
              note: Callable[[str], None]) -> None:
    from soarpack.imagestack import probe_versions

    image_py = _standin(r, work, dev_stack, note)
    if image_py is None or r.failed("image stand-in"):
        for name in ("prepare_env.sh", *REHEARSED[1:]):
            r.skip(name, "no image stand-in")
        return
    env = _rehearsal_env(image_py, dev_stack)
    # On the development stack (Python 3.11) the platform's cp310 wheels cannot install into the overlay: they are
    # installed into a fresh CPython 3.10 venv instead, and quantization runs on this environment's packages.
    no_install = _installable_here(wheel_names) if (dev_stack and wheel_names) else None
    if no_install:
        env["SOARPACK_SKIP_WHEELS"] = "1"
    sglang_mode = (manifest.get("sglang") or {}).get("mode")
    fork_copy = work / "sglang-fork"
    if sglang_fork is not None:
        # prepare_env.sh patches the image's checkout in place, and importing it writes bytecode: work on a copy,
        # never on the user's checkout.
        from soarpack.serve.patches import resolve_src

        shutil.copytree(resolve_src(sglang_fork), fork_copy / "python", symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    if sglang_fork is not None and sglang_mode == "platform":
        env["SOARPACK_SGLANG_FORK"] = str(fork_copy)
    else:
        env["SOARPACK_SKIP_SGLANG"] = "1"

    overlay_py = ""
    overlay_versions: Optional[Dict[str, str]] = None
    with r.step("prepare_env.sh") as s:
        values = source_prepare_env(root, env, cwd=work)
        if values.get("ALIVE") != "1":
            raise StepFailed(f"the shell did not keep running after sourcing it (exit {values['_rc']}): {_tail(values['_stderr'] or values['_stdout'])}")
        if values.get("ERREXIT") or values.get("NOUNSET"):
            raise StepFailed("sourcing it left set -e or set -u on in the caller's shell")
        prof = manifest.get("profile") or {}
        expected = prof.get("args_string", "")
        if sglang_mode in (None, "none") or env.get("SOARPACK_SKIP_SGLANG") or values.get("STATE", "").startswith("patched"):
            want = expected
        else:
            want = prof.get("fallback_args", expected)
        if values.get("ARGS") != want:
            raise StepFailed(f"SGLANG_SERVER_ARGS is {values.get('ARGS')!r}, expected {want!r}")
        overlay_py = values.get("PY", "")
        if not overlay_py or not Path(overlay_py).exists():
            raise StepFailed(f"no overlay venv was made: {_tail(values['_stdout'])}")
        overlay_versions = s["versions"] = probe_versions(overlay_py, env=env)
        if "!!!" in values["_stdout"]:
            raise StepFailed("it reported a failure: " + _tail("\n".join(ln for ln in values["_stdout"].splitlines() if "!!!" in ln and "!!!!!" not in ln)))
        s["detail"] = f"sourced by a shell that kept running; SGLANG_SERVER_ARGS = profile {prof.get('name')}"
    if r.failed("prepare_env.sh"):
        for name in ("bundled wheels", "sglang patches", "tiny model", "prepare_model.sh", "verify", "fork loads it", "server start"):
            r.skip(name, "prepare_env.sh failed")
        return
    with r.step("bundled wheels") as s:
        s["versions"] = overlay_versions
        if not wheel_names:
            raise StepFailed("no wheels in the bundle (built with --no-wheels): the image lacks gptqmodel and "
                             "transformers 5, so prepare_model.sh fails on the platform")
        if not no_install:
            missing = _overlay_has(overlay_py, wheel_names)
            if missing:
                raise StepFailed("not installed in the overlay: " + ", ".join(missing[:5]))
        _overlay_imports(overlay_py, env)
        s["detail"] = (f"{len(wheel_names)} cp310 wheels not installable on this Python: see the next step"
                       if no_install else f"{len(wheel_names)} wheels installed offline (--no-index) into the overlay venv")
        s["detail"] += "; it imports gptqmodel, transformers.modeling_utils and soarpack.quant"
    if no_install:
        with r.step("wheels on CPython 3.10") as s:
            s["detail"] = wheels_on_python310(root / layout.WHEELS_DIR, work / "py310")
    with r.step("sglang patches") as s:
        if sglang_mode in (None, "none"):
            raise StepSkipped("the profile needs no SGLang patches")
        if sglang_mode == "tree":
            raise StepSkipped("the patched tree was built and checked by soarpack build; installing it needs the image")
        if sglang_fork is None:
            raise StepSkipped("needs the image's SGLang fork (pass --sglang-fork DIR to rehearse the patching)")
        if values.get("STATE") != f"patched:{sglang_mode}":
            raise StepFailed(f"the patches did not apply to {sglang_fork}: see {root / 'logs' / 'prepare_env.log'}")
        from soarpack.serve.patches import check_tree

        patches = manifest["sglang"].get("patches") or []
        tree = check_tree(fork_copy / "python", patches)
        not_applied = [p.name for p in tree.patches if p.status != "applied"]
        if not_applied:
            raise StepFailed(f"prepare_env.sh reported success but these patches are not applied: {', '.join(not_applied)}")
        s["detail"] = f"patches {', '.join(patches)} applied in place to a copy of {sglang_fork} (fork commit {tree.commit})"

    tiny = work / "tiny-sala"
    with r.step("tiny model") as s:
        try:
            from soarpack.sala.tiny import make_tiny_model
        except ImportError as exc:
            raise StepSkipped(f"soarpack.sala.tiny is not available ({exc})") from None
        make_tiny_model(tiny, num_layers=4)
        s["detail"] = f"random 4-layer SALA checkpoint at {tiny}"
    if r.failed("tiny model") or not tiny.is_dir():
        r.skip("prepare_model.sh", "no tiny model")
        r.skip("verify", "no tiny model")
    else:
        quantized = work / "quantized"
        with r.step("prepare_model.sh") as s:
            s["versions"] = overlay_versions
            penv = dict(env, SOARPACK_PYTHON=overlay_py, SOARPACK_QUANTIZE_EXTRA=quantize_args)
            penv.setdefault("GPTQMODEL_CPU_WORKERS", "2")
            proc = _run(["bash", str(root / layout.PREPARE_MODEL), "--input", str(tiny), "--output", str(quantized)], env=penv, cwd=work)
            if proc.returncode != 0:
                causes = [ln for ln in proc.stdout.splitlines() if "error:" in ln]
                raise StepFailed(f"exit {proc.returncode}: {causes[-1] if causes else _tail(proc.stdout + proc.stderr)}")
            if not (quantized / "config.json").is_file():
                raise StepFailed(f"exit 0 but {quantized} holds no config.json")
            s["detail"] = f"quantized the tiny model with recipe {manifest['quantize']['recipe']} ({quantize_args})"
        with r.step("verify") as s:
            s["versions"] = overlay_versions
            if r.failed("prepare_model.sh"):
                raise StepSkipped("prepare_model.sh failed")
            proc = _run([overlay_py, "-m", "soarpack", "verify", str(quantized), "--original", str(tiny)], env=env, cwd=work)
            if proc.returncode != 0:
                raise StepFailed(_tail(proc.stdout + proc.stderr))
            s["detail"] = _tail(proc.stdout, 1)
        with r.step("fork loads it") as s:
            if r.failed("prepare_model.sh"):
                raise StepSkipped("prepare_model.sh failed")
            tree = _served_tree(root, sglang_mode, fork_copy if sglang_fork is not None else None)
            if tree is None:
                raise StepSkipped("not run: needs the fork's python/ tree (pass --sglang-fork DIR, or build with --sglang-src)")
            s["detail"], s["versions"] = _fork_load(quantized, tree, root, manifest, note)
    r.skip("server start", "needs the platform's GPU (sm_120, CUDA): `soarpack rehearse-server` on a GPU box")


def _served_tree(root: Path, sglang_mode: Optional[str], fork_copy: Optional[Path]) -> Optional[Path]:
    """The fork tree the platform's server would import: the bundle's patched tree, or the (patched) copy."""
    if sglang_mode == "tree":
        return root / layout.SGLANG_TREE / "python"
    return fork_copy / "python" if fork_copy is not None else None


def _fork_load(quantized: Path, tree: Path, root: Path, manifest: Dict[str, Any], note: Callable[[str], None]) -> tuple:
    """Load the rehearsal's checkpoint through the fork's own ModelConfig and load_weights (soarpack serve-check).

    Always on the image stack, --dev-stack or not: the fork pins transformers 4.57.1 and does not import on ours."""
    from soarpack.serve.forkcheck import run_fork_check

    quant = manifest.get("quantize") or {}
    recipe = quant.get("recipe")
    if recipe and (root / recipe).is_file():
        recipe = root / recipe
    args = (manifest.get("profile") or {}).get("args")
    result = run_fork_check(quantized, tree, recipe=recipe, server_args=args, log=note)
    if not result.ok:
        raise StepFailed(result.summary)
    return result.summary, (result.report or {}).get("versions")
