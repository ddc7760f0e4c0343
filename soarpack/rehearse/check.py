"""`soarpack check`: rehearse what the platform does with a bundle before an upload is spent.

Static steps: size, safe extraction, structure and manifest, credentials, wheel tags, `bash -n`, args lint.
Rehearsal in a temp dir, by default on a stand-in for the image's Python stack (the image's CPython with the fork's
pins, soarpack.facts.image; see imagestack.py) that sees nothing of this machine's
site-packages: source prepare_env.sh with it as the image's python (the bundle's own wheels go into the overlay
offline, with uv when soarpack's venv or PATH has it: installer.py), `bash prepare_model.sh` on a tiny SALA model, `soarpack verify` on the result,
the fork's own loader on it. `dev_stack=True` rehearses over this environment instead (fast, for tests): its report
says so and is never "uploadable". What needs the real image or a GPU is skipped, with the reason.

Each step is one function in STEPS with what it needs and whether it gates the upload (soarpack.steps): adding a
step is a function and a line in that list. A failed rehearsal keeps its logs (`logs_dir`), for `soarpack diagnose`.
"""

from __future__ import annotations

import os
import py_compile
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from soarpack.bundle import layout
from soarpack.bundle.manifest import Manifest, bundle_path_problem, consistency_problems, read_manifest, verify_files
from soarpack.errors import SoarpackError
from soarpack.facts import image, limits
from soarpack.rehearse import probes
from soarpack.steps import (FAIL, PASS, SKIP, Done, EventCallback, Risk, Runner, RunReport, StepFailed, StepSkipped,
                            lines_to, no_events, step)
from soarpack.facts.launch import DEFAULT_SERVER_ARGS as PLATFORM_DEFAULT_ARGS

# A tiny quantization run: enough rows for GPTQ's Hessians on the tiny model, minutes not hours on a CPU.
REHEARSAL_QUANTIZE = "--rows 16 --max-len 128 --device cpu --no-report"
IMAGE_STACK, DEV_STACK = "image stack", "development stack"
STATIC_CHECKS = ("structure", "credentials", "scripts syntax", "args lint")

__all__ = ["FAIL", "PASS", "SKIP", "CheckReport", "STEPS", "check_bundle", "require_bundle_file", "verdict"]


@dataclass
class Check:
    """What the steps share: the inputs, and what earlier steps established."""

    bundle: Path
    work: Path
    rehearse: bool
    sglang_src: Optional[Path]
    quantize_args: str
    dev_stack: bool
    say: Any
    report: "CheckReport"  # a step may add findings beside the steps: c.report.risks.append(Risk(...))
    manifest: Optional[Manifest] = None  # read and checked by the structure step
    wheel_names: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    no_install: Optional[str] = None  # why this Python cannot install the bundle's wheels (dev stack only)
    probe: Dict[str, str] = field(default_factory=dict)  # what sourcing prepare_env.sh left
    overlay_py: str = ""
    overlay_versions: Optional[Dict[str, str]] = None
    installer: Optional[Any] = None  # soarpack.rehearse.installer.Installer given to prepare_env.sh

    @property
    def root(self) -> Path:
        return self.work / "bundle"

    @property
    def logs(self) -> Path:
        return self.work / "logs"

    @property
    def sglang_mode(self) -> Optional[str]:
        return self.manifest.sglang.mode if self.manifest is not None else None

    def recipe(self) -> Any:
        """Where the bundle's recipe is (soarpack.recipe.files.Located), as its MANIFEST says."""
        return self.manifest.recipe_source(self.root)

    @property
    def fork_copy(self) -> Path:
        return self.work / "sglang-fork"

    def keep_log(self, name: str, text: str) -> Path:
        self.logs.mkdir(parents=True, exist_ok=True)
        path = self.logs / name
        path.write_text(text, encoding="utf-8")
        return path


# -- static steps ----------------------------------------------------------------------------------------------


@step("size")
def size(c: Check) -> Done:
    if not c.bundle.is_file():
        raise StepFailed(f"{c.bundle} is not a file")
    n = c.bundle.stat().st_size
    if n > layout.MAX_BYTES:
        raise StepFailed(f"{n / 1e9:.2f} GB is over the platform's {limits.upload_limit_words()} limit", bytes=n,
                         limit=layout.MAX_BYTES)
    close = n > layout.WARN_BYTES
    return Done(f"{n / 1e6:.1f} MB of {layout.MAX_BYTES / 1e9:.1f} GB" + (" (close to the limit)" if close else ""),
                {"bytes": n, "limit": layout.MAX_BYTES, "close_to_limit": close})


@step("extract", needs=["size"])
def extract(c: Check) -> Done:
    from soarpack.bundle.tarpack import safe_extract

    safe_extract(c.bundle, c.root)
    entries = sum(1 for _ in c.root.rglob("*"))
    c.wheel_names = sorted(p.name for p in (c.root / layout.WHEELS_DIR).glob("*.whl"))
    return Done(f"{entries} entries, every member inside the tree", {"entries": entries})


@step("structure", needs=["extract"])
def structure(c: Check) -> Done:
    missing = [name for name in layout.REQUIRED if not (c.root / name).is_file()]
    if missing:
        raise StepFailed("missing: " + ", ".join(missing), missing=missing)
    manifest = read_manifest(c.root)
    problems = verify_files(c.root, manifest)
    if problems:
        raise StepFailed(f"{len(problems)} file(s) disagree with MANIFEST.json: " + "; ".join(problems[:5]),
                         problems=problems)
    if not manifest.quantize.recipe:
        raise StepFailed("MANIFEST.json names no recipe")
    for calib in manifest.quantize.calib + manifest.quantize.held_out:
        problem = bundle_path_problem(calib)
        if problem:
            raise StepFailed(f"calibration entry {calib!r} {problem}")
        if not (c.root / calib).is_file():
            raise StepFailed(f"calibration file {calib} is missing", missing=[calib])
    problems = consistency_problems(c.root, manifest)  # the MANIFEST, bundle.env and what check says: one record
    if problems:
        raise StepFailed("; ".join(problems), problems=problems)
    if sorted(manifest.wheels.files) != c.wheel_names:
        raise StepFailed("wheels/ does not match the manifest's wheel list")
    c.manifest = manifest
    from soarpack.bundle.risks import manifest_risks

    c.report.risks.extend(manifest_risks(manifest))
    return Done(f"{len(manifest.files)} files match MANIFEST.json (bundle {manifest.id[:12]}, "
                f"soarpack {manifest.soarpack_version}, recipe {manifest.quantize.recipe_name})",
                {"files": len(manifest.files), "soarpack_version": manifest.soarpack_version, "id": manifest.id})


@step("credentials", needs=["extract"])
def credentials(c: Check) -> Done:
    from soarpack.bundle.secrets import scan_tree

    scan_tree(c.root)
    return Done("no credential-looking file")


@step("wheel tags", needs=["extract"])
def wheel_tags(c: Check) -> Done:
    from soarpack.bundle.wheels import wheel_tag_problems

    if not c.wheel_names:
        raise StepSkipped("no wheels in the bundle (built with --no-wheels)", wheels=0)
    bad = wheel_tag_problems(c.wheel_names)
    if bad:
        raise StepFailed("; ".join(bad[:5]), problems=bad)
    return Done(f"{len(c.wheel_names)} wheels installable on CPython 3.10 manylinux x86_64", {"wheels": len(c.wheel_names)})


@step("scripts syntax", needs=["extract"])
def scripts_syntax(c: Check) -> Done:
    for name in (layout.PREPARE_ENV, layout.PREPARE_MODEL):
        proc = probes.run(["bash", "-n", str(c.root / name)])
        if proc.returncode != 0:
            raise StepFailed(f"bash -n {name}: {probes.tail(proc.stderr)}", script=name)
    try:
        py_compile.compile(str(c.root / layout.PREPROCESS), cfile=str(c.work / "preprocess.pyc"), doraise=True)
    except py_compile.PyCompileError as exc:
        raise StepFailed(f"{layout.PREPROCESS}: {exc.msg}", script=layout.PREPROCESS) from None
    code_lines = [ln.split("#", 1)[0] for ln in (c.root / layout.PREPARE_ENV).read_text().splitlines()]
    if any("exit" in ln.split() or "set -e" in ln or "set -u" in ln for ln in code_lines):
        raise StepFailed("prepare_env.sh uses exit, set -e or set -u: sourcing it could stop the platform's script",
                         script=layout.PREPARE_ENV)
    return Done("bash -n on both scripts, preprocess_model.py compiles, prepare_env.sh has no exit/set -e")


@step("args lint", needs=["structure"])
def args_lint(c: Check) -> Done:
    from soarpack.serve.lint import lint_args

    findings = lint_args(c.manifest.profile.args, recipe=c.recipe(), patched=c.manifest.patched())
    found = [f.to_dict() for f in findings]
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise StepFailed("; ".join(f"{f.rule}: {f.message}" for f in errors), findings=found)
    return Done("; ".join(f"{f.level} {f.rule}" for f in findings) or "no findings", {"findings": found})


# -- the rehearsal ---------------------------------------------------------------------------------------------


@step("image stand-in", needs=STATIC_CHECKS)
def image_standin(c: Check) -> Done:
    """The image's python for the rehearsal: the cached image stack, or a venv over this environment."""
    from soarpack.imagestack import clean_env, ensure_image_stack, make_dev_standin, probe_versions

    if not c.rehearse:
        raise StepSkipped("--no-rehearse")
    if c.dev_stack:
        image_py = make_dev_standin(c.work / "image")
        detail = f"{DEV_STACK}: a venv at {c.work / 'image'} over this environment's packages"
    else:
        image_py = ensure_image_stack(on_event=lambda e: c.say(e.message)).python
        detail = f"{IMAGE_STACK}: CPython 3.10 with the fork's pins, cached at {image_py.parent.parent}"
    # On the image stack nothing of this environment may leak in (PYTHONPATH above all).
    env = dict(os.environ) if c.dev_stack else clean_env()
    for key in ("SOARPACK_PYTHON", "SOARPACK_PLATFORM_SGLANG_SERVER_ARGS", "SOARPACK_SKIP_WHEELS", "SOARPACK_SKIP_SGLANG"):
        env.pop(key, None)
    from soarpack.rehearse.installer import expose, find_installer

    # uv as on the platform: the one beside soarpack's Python (a venv not activated: not on PATH) or on PATH.
    c.installer = find_installer()
    c.report.installer = c.installer.to_dict()
    path = [str(image_py.parent), *expose(c.installer, c.work / "tools"), env.get("PATH", "")]
    env.update({"SOARPACK_IMAGE_PYTHON": str(image_py), "SGLANG_SERVER_ARGS": PLATFORM_DEFAULT_ARGS,
                "PATH": os.pathsep.join(path), "VIRTUAL_ENV": str(image_py.parent.parent)})
    if c.dev_stack and c.wheel_names:
        # On the development stack (Python 3.11) the platform's cp310 wheels cannot install into the overlay: they
        # go into a fresh CPython 3.10 venv instead, and quantization runs on this environment's packages.
        from soarpack.bundle.wheels import not_installable_here

        c.no_install = not_installable_here(c.wheel_names)
    if c.no_install:
        env["SOARPACK_SKIP_WHEELS"] = "1"
    if c.sglang_src is not None:
        # prepare_env.sh patches the image's checkout in place, and importing it writes bytecode: work on a copy,
        # never on the user's checkout.
        from soarpack.serve.patches import resolve_src

        shutil.copytree(resolve_src(c.sglang_src), c.fork_copy / "python", symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    if c.sglang_src is not None and c.sglang_mode == "platform":
        env["SOARPACK_SGLANG_FORK"] = str(c.fork_copy)
    else:
        env["SOARPACK_SKIP_SGLANG"] = "1"
    c.env = env
    return Done(f"{detail}; installer {c.installer.name} ({c.installer.why})",
                {"stack": DEV_STACK if c.dev_stack else IMAGE_STACK, "python": str(image_py),
                 "installer": c.installer.to_dict()}, probe_versions(image_py, env=env))


@step("prepare_env.sh", needs=["image stand-in"], gates=True)
def prepare_env(c: Check) -> Done:
    from soarpack.imagestack import probe_versions

    values = c.probe = probes.source_prepare_env(c.root, c.env, cwd=c.work)
    c.keep_log("prepare_env.source.log", values["_stdout"] + values["_stderr"])
    if values.get("ALIVE") != "1":
        raise StepFailed(f"the shell did not keep running after sourcing it (exit {values['_rc']}): "
                         f"{probes.tail(values['_stderr'] or values['_stdout'])}", exit_code=int(values["_rc"]))
    if values.get("ERREXIT") or values.get("NOUNSET"):
        raise StepFailed("sourcing it left set -e or set -u on in the caller's shell")
    prof = c.manifest.profile
    expected = prof.args_string
    patched = values.get("STATE", "").startswith("patched")
    want = expected if (c.sglang_mode in (None, "none") or c.env.get("SOARPACK_SKIP_SGLANG") or patched) \
        else prof.fallback_args
    if values.get("ARGS") != want:
        raise StepFailed(f"SGLANG_SERVER_ARGS is {values.get('ARGS')!r}, expected {want!r}",
                         args=values.get("ARGS"), expected=want)
    c.overlay_py = values.get("PY", "")
    if not c.overlay_py or not Path(c.overlay_py).exists():
        raise StepFailed(f"no overlay venv was made: {probes.tail(values['_stdout'])}")
    c.overlay_versions = probe_versions(c.overlay_py, env=c.env)
    reported = [ln for ln in values["_stdout"].splitlines() if "!!!" in ln and "!!!!!" not in ln]
    if "!!!" in values["_stdout"]:
        raise StepFailed("it reported a failure: " + probes.tail("\n".join(reported)), versions=c.overlay_versions)
    return Done(f"sourced by a shell that kept running; SGLANG_SERVER_ARGS = profile {prof.name}",
                {"profile": prof.name, "args": values.get("ARGS"), "sglang_state": values.get("STATE", ""),
                 "overlay_python": c.overlay_py}, c.overlay_versions)


@step("bundled wheels", needs=["prepare_env.sh"], gates=True)
def bundled_wheels(c: Check) -> Done:
    if not c.wheel_names:
        raise StepFailed("no wheels in the bundle (built with --no-wheels): the image lacks gptqmodel and "
                         "transformers 5, so prepare_model.sh fails on the platform", wheels=0, versions=c.overlay_versions)
    if not c.no_install:
        missing = probes.overlay_lacks(c.overlay_py, c.wheel_names)
        if missing:
            raise StepFailed("not installed in the overlay: " + ", ".join(missing[:5]), missing=missing,
                             versions=c.overlay_versions)
    probes.overlay_imports(c.overlay_py, c.env)
    from soarpack.rehearse.installer import installer_that_ran

    ran = installer_that_ran(c.probe.get("_stdout", ""))
    c.report.installer = dict(c.report.installer or {}, ran=ran)
    if c.no_install:
        detail = f"{len(c.wheel_names)} cp310 wheels not installable on this Python: see the next step"
    elif ran is None:  # prepare_env.sh logged no install (a marker from an earlier sourcing, say)
        detail = f"{len(c.wheel_names)} wheels in the overlay venv, no install logged ({c.installer.why})"
    else:
        detail = f"{len(c.wheel_names)} wheels installed offline (--no-index) into the overlay venv with {ran} "
        detail += f"({c.installer.why})" if ran == c.installer.name else f"(although {c.installer.why})"
    return Done(detail + "; it imports gptqmodel, transformers.modeling_utils and soarpack.quant",
                {"wheels": len(c.wheel_names), "installed_into_overlay": not c.no_install, "installer": ran,
                 "installer_why": c.installer.why}, c.overlay_versions)


@step("wheels on CPython 3.10", needs=["prepare_env.sh"])
def wheels_on_python310(c: Check) -> Done:
    if not c.no_install:
        raise StepSkipped("not needed: the wheels went into the overlay itself" if c.wheel_names else "no wheels")
    data = probes.wheels_on_python310(c.root / layout.WHEELS_DIR, c.work / "py310")
    return Done(f"{data['wheels']} wheels installed offline (--no-index --no-deps) into a fresh CPython 3.10 venv; "
                f"complete but for torch (the image's); numpy {data['numpy']}, transformers {data['transformers']}, "
                "pcre import", data)


@step("sglang patches", needs=["prepare_env.sh"])
def sglang_patches(c: Check) -> Done:
    if c.sglang_mode in (None, "none"):
        raise StepSkipped("the profile needs no SGLang patches")
    if c.sglang_mode == "tree":
        raise StepSkipped("the patched tree was built and checked by soarpack build; installing it needs the image")
    if c.sglang_src is None:
        raise StepSkipped("needs the image's SGLang fork (pass --sglang-src DIR to rehearse the patching)",
                          missing="sglang_src")
    if c.probe.get("STATE") != f"patched:{c.sglang_mode}":
        raise StepFailed(f"the patches did not apply to {c.sglang_src}: see {c.root / 'logs' / 'prepare_env.log'}",
                         sglang_state=c.probe.get("STATE"))
    from soarpack.serve.patches import check_tree

    patches = c.manifest.sglang.patches
    tree = check_tree(c.fork_copy / "python", patches)
    not_applied = [p.name for p in tree.patches if p.status != "applied"]
    if not_applied:
        raise StepFailed(f"prepare_env.sh reported success but these patches are not applied: {', '.join(not_applied)}",
                         not_applied=not_applied)
    return Done(f"patches {', '.join(patches)} applied in place to a copy of {c.sglang_src} (fork commit {tree.commit})",
                {"patches": patches, "fork_commit": tree.commit})


@step("tiny model", needs=["prepare_env.sh"])
def tiny_model(c: Check) -> Done:
    try:
        from soarpack.sala.tiny import make_tiny_model
    except ImportError as exc:
        raise StepSkipped(f"soarpack.sala.tiny is not available ({exc})") from None
    make_tiny_model(c.work / "tiny-sala", num_layers=4)
    return Done(f"random 4-layer SALA checkpoint at {c.work / 'tiny-sala'}", {"path": str(c.work / "tiny-sala"), "layers": 4})


@step("prepare_model.sh", needs=["prepare_env.sh", "tiny model"], gates=True)
def prepare_model(c: Check) -> Done:
    quantized = c.work / "quantized"
    env = dict(c.env, SOARPACK_PYTHON=c.overlay_py, SOARPACK_QUANTIZE_EXTRA=c.quantize_args)
    env.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    proc = probes.run(["bash", str(c.root / layout.PREPARE_MODEL), "--input", str(c.work / "tiny-sala"),
                       "--output", str(quantized)], env=env, cwd=c.work)
    log = c.keep_log("prepare_model.run.log", proc.stdout + proc.stderr)
    if proc.returncode != 0:
        causes = [ln for ln in proc.stdout.splitlines() if "error:" in ln]
        raise StepFailed(f"exit {proc.returncode}: {causes[-1] if causes else probes.tail(proc.stdout + proc.stderr)}",
                         exit_code=proc.returncode, log=str(log), versions=c.overlay_versions)
    if not (quantized / "config.json").is_file():
        raise StepFailed(f"exit 0 but {quantized} holds no config.json", versions=c.overlay_versions)
    recipe = c.manifest.quantize.recipe
    from soarpack.quant.capture import count_said

    data = {"recipe": recipe, "quantize_args": c.quantize_args, "output": str(quantized)}
    if c.manifest.quantize.method == "none":  # the recipe quantizes nothing: preprocess copied it
        detail = f"copied the tiny model as it is (recipe {recipe} quantizes nothing; the server quantizes at load)"
    else:
        detail = f"quantized the tiny model with recipe {recipe} ({c.quantize_args})"
    said = count_said(proc.stdout)
    if said:  # the libraries' warnings went to quantize's log: the count and where, not the lines
        data.update(library_warnings=said[0], library_log=said[1])
        detail += f"; {said[0]} library warning{'s' if said[0] != 1 else ''} in the bundle's logs/{Path(said[1]).name}"
    return Done(detail, data, c.overlay_versions)


@step("verify", needs=["prepare_model.sh"], gates=True)
def verify(c: Check) -> Done:
    proc = probes.run([c.overlay_py, "-m", "soarpack", "verify", str(c.work / "quantized"), "--original",
                       str(c.work / "tiny-sala")], env=c.env, cwd=c.work)
    if proc.returncode != 0:
        log = c.keep_log("verify.log", proc.stdout + proc.stderr)
        raise StepFailed(probes.tail(proc.stdout + proc.stderr), exit_code=proc.returncode, log=str(log),
                         versions=c.overlay_versions)
    return Done(probes.tail(proc.stdout, 1), {"exit_code": 0}, c.overlay_versions)


@step("fork loads it", needs=["prepare_model.sh"])
def fork_loads_it(c: Check) -> Done:
    """The checkpoint through the fork's own ModelConfig and load_weights (soarpack serve-check).

    Always on the image stack, --dev-stack or not: the fork pins its own transformers and does not import on ours."""
    from soarpack.serve.forkcheck import run_fork_check, unwritten_required

    if c.sglang_mode == "tree":
        tree = c.root / layout.SGLANG_TREE / "python"
    elif c.sglang_src is not None:
        tree = c.fork_copy / "python"
    else:
        raise StepSkipped("not run: needs the fork's python/ tree (pass --sglang-src DIR, or build with --sglang-src)",
                          missing="sglang_src")
    result = run_fork_check(c.work / "quantized", tree, recipe=c.recipe(), server_args=c.manifest.profile.args,
                            on_event=lambda e: c.say(e.message))
    report = result.report or {}
    data = {"recipe": result.recipe, "fork_commit": result.fork_commit,
            "linears": len(result.rows), "as_planned": sum(r.ok for r in result.rows),
            "tensors_loaded": report.get("tensors_loaded"), "without_parameter": len(report.get("orphans", [])),
            "unwritten": len(unwritten_required(report)), "problems": result.problems,
            "versions": report.get("versions")}
    if not result.ok:
        if result.log:
            data["log"] = str(c.keep_log("fork-check.log", result.log))
        raise StepFailed(result.summary, **data)
    versions = data.pop("versions")
    return Done(result.summary, data, versions)


@step("server start", needs=["verify"])
def server_start(c: Check) -> Done:
    raise StepSkipped("needs the platform's GPU (sm_120, CUDA): `soarpack rehearse-server` on a GPU box", needs="gpu")


STEPS = [size, extract, structure, credentials, wheel_tags, scripts_syntax, args_lint,
         image_standin, prepare_env, bundled_wheels, wheels_on_python310, sglang_patches, tiny_model, prepare_model,
         verify, fork_loads_it, server_start]


# -- the report and the verdict --------------------------------------------------------------------------------


@dataclass
class CheckReport(RunReport):
    bundle: str = ""
    stack: str = IMAGE_STACK
    logs_dir: Optional[str] = None  # where a failed rehearsal's logs were kept (what `soarpack diagnose` reads)
    accepted: List[str] = field(default_factory=list)  # --accept-risk: risks that no longer block
    strict: bool = False  # --strict: every risk not accepted blocks
    installer: Optional[Dict[str, Any]] = None  # what the rehearsal gave prepare_env.sh (name, uv, why) and what ran

    def gate(self) -> Dict[str, List[str]]:
        gate = super().gate()
        from soarpack.bundle.risks import blocking_risks

        gate["risks"] = [r.name for r in blocking_risks(self.risks, self.accepted, self.strict)]
        return gate

    def _steps_say_no(self) -> Optional[str]:
        gate = self.gate()
        if gate["failed"]:
            return f"failed: {', '.join(gate['failed'])}"
        if gate["not_run"]:
            return f"not rehearsed: {', '.join(gate['not_run'])}"
        if self.stack != IMAGE_STACK:
            return f"rehearsed on the development stack, not the image's ({image.describe_short()})"
        return None

    @property
    def not_uploadable_because(self) -> Optional[str]:
        """None when the bundle did on the image's stack all that the platform does before the server starts,
        and no risk blocks (a measured ori at or below the full-credit line, unless accepted)."""
        why = self._steps_say_no()
        if why is None and self.gate()["risks"]:
            why = f"risks: {', '.join(self.gate()['risks'])}"
        return why

    @property
    def uploadable(self) -> bool:
        return self.not_uploadable_because is None

    def verdict_line(self) -> str:
        """`uploadable`, `uploadable, 2 risks: a, b` or `NOT uploadable (why)` (soarpack.bundle.risks.verdict)."""
        from soarpack.bundle.risks import verdict as risk_verdict

        return risk_verdict(self._steps_say_no(), self.risks, self.accepted, self.strict)[0]

    def to_dict(self) -> Dict[str, Any]:
        return {"bundle": self.bundle, "ok": self.ok, "stack": self.stack, "uploadable": self.uploadable,
                "not_uploadable_because": self.not_uploadable_because, "verdict": self.verdict_line(),
                "gate": self.gate(), "risks": [r.to_dict() for r in self.risks], "accepted_risks": self.accepted,
                "logs_dir": self.logs_dir, "diagnose": diagnose_command(self.logs_dir), "versions": self.versions,
                "installer": self.installer,
                "steps": [s.to_dict() for s in self.steps]}


def diagnose_command(logs_dir: Optional[str]) -> Optional[str]:
    import shlex

    return f"soarpack diagnose {shlex.quote(logs_dir)}" if logs_dir else None


def verdict(report: CheckReport) -> str:
    """The last line: the verdict with its risks, then the tally of the steps."""
    counts = {k: sum(s.status == k for s in report.steps) for k in (PASS, FAIL, SKIP)}
    tally = f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped on the {report.stack}"
    return f"{report.verdict_line()} -- {tally}"


def check_bundle(bundle: os.PathLike, *, rehearse: bool = True, sglang_src: Optional[os.PathLike] = None,
                 work_dir: Optional[os.PathLike] = None, keep: bool = False, quantize_args: str = REHEARSAL_QUANTIZE,
                 dev_stack: bool = False, risks: Optional[List[Risk]] = None, accept_risk: Sequence[str] = (),
                 strict: bool = False, on_event: EventCallback = no_events) -> CheckReport:
    """Run every step of STEPS; each passes, fails or is skipped with its reason. `risks` go beside the steps into
    the verdict and the gate. A failed rehearsal in a temp folder keeps its logs in `report.logs_dir`.
    A `bundle` that is missing, a directory or not gzip content is bad input (SoarpackError), not a verdict."""
    require_bundle_file(bundle)
    if sglang_src is not None:
        from soarpack.serve.patches import resolve_src

        resolve_src(sglang_src)  # not a fork checkout: say so now, not as a crash in the rehearsal
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
        from soarpack.placement.checks import ensure_writable_output

        ensure_writable_output(work / "bundle", what="--keep folder")
    from soarpack.bundle.risks import check_accepted

    report = CheckReport(bundle=str(bundle), stack=DEV_STACK if dev_stack else IMAGE_STACK, risks=list(risks or []),
                         accepted=check_accepted(accept_risk), strict=strict)
    ctx = Check(Path(bundle), work, rehearse, Path(sglang_src) if sglang_src is not None else None, quantize_args,
                dev_stack, lines_to(on_event, "check"), report)
    try:
        Runner(STEPS, on_event).run(ctx, report)
        if not report.ok and (ctx.logs.is_dir() or (ctx.root / "logs").is_dir()):
            report.logs_dir = str(work if tmp_obj is None else _keep_logs(ctx, report))
        return report
    finally:
        if tmp_obj is not None and not keep:
            tmp_obj.cleanup()


def require_bundle_file(bundle: os.PathLike) -> None:
    """Refuse, as bad input, a BUNDLE that cannot be a bundle at all: a missing path, a directory, a file that is
    not gzip (the platform runs `tar xzf` on the upload). A gzip file that does not extract is the bundle's
    fault: the extract step fails it."""
    from soarpack.bundle.tarpack import require_gzip
    from soarpack.errors import InputDataError

    path = Path(bundle)
    if not path.exists():
        raise InputDataError(f"bundle {path} does not exist",
                             "pass the .tar.gz that `soarpack build` wrote (it prints its path)")
    if path.is_dir():
        raise InputDataError(f"bundle {path} is a directory",
                             "pass the .tar.gz itself, or run `soarpack check` in that folder: it takes the newest "
                             "soarpack-*.tar.gz there")
    try:
        require_gzip(path)
    except OSError as exc:
        raise InputDataError(f"bundle {path} cannot be read ({exc.strerror or exc})", "check the path") from None


def _keep_logs(ctx: Check, report: CheckReport) -> Path:
    """Copy a failed rehearsal's logs (the bundle's own and the steps') out of the temp folder before it goes."""
    import json

    dest = Path(tempfile.mkdtemp(prefix=f"soarpack-check-failed-{time.strftime('%Y%m%d-%H%M%S')}-"))
    for src in (ctx.root / "logs", ctx.logs):
        if src.is_dir():
            for f in sorted(src.glob("*")):
                if f.is_file():
                    shutil.copyfile(f, dest / f.name)
    (dest / "check.json").write_text(json.dumps(report.to_dict(), indent=2, default=str), encoding="utf-8")
    return dest
