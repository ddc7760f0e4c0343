"""The quantization stack as wheels for the platform: CPython 3.10, manylinux x86_64, torch from the image.

`platform-lock.json` (beside this file) pins the closure of the engine's pin (+ the newest transformers for the
image's Python, and soarpack's own runtime deps; soarpack.facts.engine) minus torch and what only torch needs: the
image has those.
`resolve_lock()` regenerates it with pip's resolver, a metadata-only stub standing in for the image's torch.
`collect_wheels()` fills a bundle's wheels/ from a local cache, downloading with pip (`--only-binary`, the
platform's tags) and building the sdist-only packages (gptqmodel, pypcre, ...) with a local Python 3.10.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, List, Optional, Sequence

from soarpack import cachelock
from soarpack.errors import SoarpackError
from soarpack.facts import engine as engine_facts, image
from soarpack.placement.content import sha256_file
from soarpack.placement.write import atomic_write_json
from soarpack.imagestack import cache_root, find_python310, make_cache_dir  # noqa: F401 - find_python310 is used here and by callers
from soarpack.steps import EventCallback, lines_to, no_events

LOCK_PATH = Path(__file__).resolve().parent / "platform-lock.json"
TARGET_PYTHON = image.PYTHON
TARGET_PLATFORMS = image.MANYLINUX_TAGS
IMAGE_TORCH = image.TORCH
# The roots of the closure: the quantization engine pinned as the platform needs it, and soarpack's deps.
LOCK_ROOTS = (
    engine_facts.GPTQMODEL_SPEC, f"transformers=={engine_facts.BUNDLED_TRANSFORMERS}",
    f"numpy=={engine_facts.BUNDLED_NUMPY}", "safetensors", "tokenizers", "huggingface_hub",
    "typer", "rich", "httpx", "pydantic", "jinja2", "tomli",
)
# On PyPI these exist only as sdists (checked 2026-11-29); pypcre is a C extension and needs a CPython 3.10.
SDIST_ONLY = ("gptqmodel", "device-smi", "tokenicer", "logbar", "defuser", "pypcre")
# The image's own pins for what it provides (the fork's python/pyproject.toml): what a bundled wheel sees through
# the overlay's .pth when the bundle does not ship the package itself.
IMAGE_PROVIDES = dict(image.PINS)
# The image's CPython; a wheel's Requires-Python and markers are evaluated against it.
IMAGE_PYTHON_FULL = image.PYTHON_FULL


@dataclass(frozen=True)
class Exemption:
    why: str
    declared_by: tuple
    # True: the requirers' declared need may stay unmet on the platform. False: the image provides the package, and
    # its pinned version (IMAGE_PROVIDES) must still satisfy every need.
    need_may_stay_unmet: bool


# Packages that a bundled wheel declares but the bundle leaves out on purpose. The lock (resolve_lock), the
# build's compatibility check and check's `pip check` reading all honour this one table.
NOT_BUNDLED = {
    "torch": Exemption(f"the image's torch {image.TORCH} (CUDA) is the one the server and quantization run on",
                       ("gptqmodel", "accelerate"), need_may_stay_unmet=False),
    "torchao": Exemption(
        f"transformers {engine_facts.BUNDLED_TRANSFORMERS} imports any installed torchao >= 0.15 at import time, and "
        f"torchao 0.18.0 needs a newer torch than the image's {image.TORCH} (ImportError: cannot import name "
        "'ScalingType'), which killed every default bundle on the platform. GPTQModel imports it only in guarded "
        f"NVFP4/rotation code that soarpack never runs. The image's own torchao {image.TORCHAO} stays visible behind "
        "the overlay; being below transformers' minimum, it is not imported.",
        ("gptqmodel",), need_may_stay_unmet=True),
}


class WheelError(SoarpackError):
    """The platform wheel set could not be collected."""


@dataclass(frozen=True)
class LockedWheel:
    name: str
    version: str
    source: str  # "pypi": a published binary wheel; "sdist": built here from the published sdist
    filename: Optional[str] = None  # pypi only
    sha256: Optional[str] = None  # pypi only

    @property
    def spec(self) -> str:
        return f"{self.name}=={self.version}"


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def load_lock(path: Path = LOCK_PATH) -> List[LockedWheel]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return [LockedWheel(**w) for w in data["wheels"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WheelError(f"cannot read the wheel lock {path}: {exc}", "regenerate it with soarpack.bundle.wheels.resolve_lock()") from exc


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def make_pure_wheel(dest_dir: Path, name: str, version: str, modules: Optional[dict] = None,
                    requires: Sequence[str] = (), requires_python: Optional[str] = None) -> Path:
    """Write a minimal py3-none-any wheel (a module dict {path: source}); a stub when modules is empty.

    Used as the image's torch during resolution, and by tests as a tiny offline-installable wheel set.
    """
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires_python:
        meta += f"Requires-Python: {requires_python}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = dict(modules or {})
    files[f"{info}/METADATA"] = meta
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: soarpack\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{dist}-{version}-py3-none-any.whl"
    records = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname in sorted(files):
            data = files[arcname].encode("utf-8")
            zi = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zf.writestr(zi, data)
            records.append(_record_line(arcname, data))
        records.append(f"{info}/RECORD,,")
        zi = zipfile.ZipInfo(f"{info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0))
        zi.external_attr = 0o644 << 16
        zf.writestr(zi, "\n".join(records) + "\n")
    return path


# pip's lines worth showing while it works: one per package fetched or built (the rest is resolver chatter).
_PIP_PROGRESS = ("Collecting ", "Downloading ", "Building wheel for ", "Created wheel for ", "File was already downloaded")


def _pip(python: str, args: Sequence[str], what: str, log: Optional[Callable[[str], None]] = None,
         env: Optional[dict] = None) -> str:
    """Run pip; stream its per-package lines to `log` as they come; return its output. A failure raises WheelError."""
    cmd = [python, "-m", "pip", *args]
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}  # its lines as they come, not in blocks
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if log is not None and line.lstrip().startswith(_PIP_PROGRESS):
            log(f"  pip: {line.strip()}")
    returncode = proc.wait()
    if returncode != 0:
        tail = [ln for ln in lines if ln.strip()][-3:]
        raise WheelError(f"{what} failed: {' | '.join(tail) or 'pip exited ' + str(returncode)}",
                         "check the network to PyPI, or build with --wheel-dir DIR")
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def platform_tags() -> frozenset:
    """Every wheel tag CPython 3.10 on manylinux x86_64 (the platform image) accepts."""
    from packaging.tags import compatible_tags, cpython_tags

    platforms = list(TARGET_PLATFORMS) + [f"manylinux_2_{m}_x86_64" for m in range(5, 35)] + ["manylinux2010_x86_64", "manylinux1_x86_64"]
    version = tuple(int(part) for part in image.PYTHON.split("."))
    tags = set(cpython_tags(version, abis=[image.PYTHON_TAG, "abi3", "none"], platforms=platforms))
    tags |= set(compatible_tags(version, image.PYTHON_TAG, platforms=platforms))
    return frozenset(tags)


def _wheel_matches(path: Path, w: LockedWheel) -> bool:
    from packaging.utils import parse_wheel_filename

    try:
        name, version, _, tags = parse_wheel_filename(path.name)
    except Exception:
        return False
    return canonical(name) == canonical(w.name) and str(version) == w.version and bool(set(tags) & platform_tags())


def _cached(cache: Path, w: LockedWheel) -> Optional[Path]:
    if w.filename and (cache / w.filename).is_file():
        path = cache / w.filename
        return path if not w.sha256 or sha256_file(path) == w.sha256 else None
    # A mirror may serve the same release under another file name (other tags): match name and version.
    hits = sorted(p for p in cache.glob("*.whl") if _wheel_matches(p, w))
    return hits[0] if hits else None


def default_cache_dir() -> Path:
    """The wheel cache: `cache_root()/wheels` ($SOARPACK_CACHE, else $XDG_CACHE_HOME or ~/.cache, then soarpack)."""
    return cache_root() / "wheels"


def _platform_args() -> List[str]:
    args = ["--only-binary", ":all:", "--python-version", TARGET_PYTHON, "--implementation", "cp", "--abi", image.PYTHON_TAG]
    for plat in TARGET_PLATFORMS:
        args += ["--platform", plat]
    return args


def fetch_into_cache(lock: Sequence[LockedWheel], cache: Path, on_event: EventCallback = no_events) -> None:
    """Download/build every locked wheel that the cache lacks (network to PyPI needed only then)."""
    make_cache_dir(cache, "wheel cache")
    with cachelock.shared(cache):  # in use: `soarpack cache clear` refuses meanwhile
        _fetch_into_cache(lock, cache, lines_to(on_event, "wheels"), on_event)


def _fetch_into_cache(lock: Sequence[LockedWheel], cache: Path, log: Callable[[str], None],
                      on_event: EventCallback) -> None:
    missing = [w for w in lock if _cached(cache, w) is None]
    binaries = [w for w in missing if w.source == "pypi"]
    sdists = [w for w in missing if w.source == "sdist"]
    for w in binaries:  # a cached file under the locked name failed its sha256: fetch it again, not trust it
        if w.filename and (cache / w.filename).is_file():
            (cache / w.filename).unlink()
    if binaries:
        log(f"downloading {len(binaries)} wheels for {image.PYTHON_TAG} {image.PLATFORM_WORDS} into {cache}")
        _pip(sys.executable, ["download", "--no-deps", "--disable-pip-version-check", "--progress-bar", "off", "-d",
                              str(cache), *_platform_args(), *[w.spec for w in binaries]],
             "pip download of the platform wheels", log=log)
    if sdists:
        py310 = find_python310()
        needs_310 = [w for w in sdists if canonical(w.name) == "pypcre"]
        if needs_310 and py310 is None:
            raise WheelError("building the pypcre wheel needs a CPython 3.10 (the platform's Python) and none was found",
                             "install one (pyenv install 3.10" + (", uv python install 3.10" if shutil.which("uv") else "")
                             + ") or point SOARPACK_PYTHON310 at one")
        build_sdist_wheels(py310 or sys.executable, sdists, cache, on_event)
    still = [w.spec for w in lock if _cached(cache, w) is None]
    if still:
        raise WheelError(f"{len(still)} locked wheels are missing or have the wrong sha256 after download: {', '.join(still[:5])}",
                         f"delete {cache} and build again")


def build_sdist_wheels(builder: str, sdists: Sequence[LockedWheel], cache: Path,
                       on_event: EventCallback = no_events) -> None:
    """Build the sdist-only packages into `cache` reproducibly: the same sdist gives the same wheel bytes on any
    machine with the same compiler, whatever the cache or temp folder (see normalize_wheel)."""
    from soarpack.bundle.tarpack import FIXED_MTIME, safe_extract

    log = lines_to(on_event, "wheels")
    log(f"building {len(sdists)} sdist-only packages into wheels with {builder}")
    with tempfile.TemporaryDirectory(prefix="soarpack-sdist-") as tmp:
        tmp = Path(tmp)
        _pip(builder, ["download", "--no-deps", "--disable-pip-version-check", "--progress-bar", "off", "--no-binary",
                       ",".join(w.name for w in sdists), "-d", str(tmp / "sdists"), *[w.spec for w in sdists]],
             "downloading the sdists", log=log)
        sources = []
        for archive in sorted((tmp / "sdists").iterdir()):
            dest = tmp / "src" / archive.name
            if archive.suffix == ".zip":
                with zipfile.ZipFile(archive) as zf:
                    zf.extractall(dest)
            else:
                safe_extract(archive, dest)
            sources += [str(d) for d in sorted(dest.iterdir()) if d.is_dir()]
        # The build folder is random: map it away, or the C extension's debug info records it.
        cflags = f"{os.environ.get('CFLAGS', '')} -ffile-prefix-map={tmp}=/soarpack-build".strip()
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(FIXED_MTIME), "PYTHONHASHSEED": "0", "CFLAGS": cflags}
        _pip(builder, ["wheel", "--no-deps", "--disable-pip-version-check", "-w", str(tmp / "built"), *sources],
             "building wheels from the sdist-only packages", log=log, env=env)
        for wheel in sorted((tmp / "built").glob("*.whl")):
            normalize_wheel(wheel, cache / wheel.name)


def normalize_wheel(src: Path, dest: Path) -> Path:
    """Rewrite a wheel deterministically: members sorted (.dist-info last), fixed timestamps and permissions
    (0644, 0755 for executables), RECORD regenerated from the bytes written."""
    from soarpack.placement.write import atomic_file

    with zipfile.ZipFile(src) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        record = next((i.filename for i in infos if i.filename.endswith(".dist-info/RECORD")), None)
        if record is None:
            raise WheelError(f"{src.name} has no .dist-info/RECORD", "the build backend wrote a broken wheel")
        members = {i.filename: (zf.read(i), bool((i.external_attr >> 16) & 0o111)) for i in infos
                   if i.filename != record and not i.filename.endswith((".dist-info/RECORD.jws", ".dist-info/RECORD.p7s"))}
    names = sorted(members, key=lambda n: (n.split("/", 1)[0].endswith(".dist-info"), n))
    lines = [_record_line(name, members[name][0]) for name in names] + [f"{record},,"]
    with atomic_file(dest) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as out:
            for name, data, executable in [(n, *members[n]) for n in names] + [(record, ("\n".join(lines) + "\n").encode(), False)]:
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
                info.create_system = 3
                info.external_attr = (0o100755 if executable else 0o100644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                out.writestr(info, data, compresslevel=6)
    return dest


def collect_wheels(dest: Path, *, cache: Optional[Path] = None, wheel_dir: Optional[Path] = None,
                   lock_path: Path = LOCK_PATH, on_event: EventCallback = no_events) -> List[str]:
    """Copy the platform wheel set into dest; return the file names.

    wheel_dir: use exactly the *.whl files of this folder (no lock, no network); otherwise the locked set from
    the cache, fetched on a miss.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as using:
        if wheel_dir is not None:
            sources = sorted(Path(wheel_dir).glob("*.whl"))
            if not sources:
                raise WheelError(f"--wheel-dir {wheel_dir} holds no .whl files", "pass a folder of wheels or use --no-wheels")
        else:
            lock = load_lock(lock_path)
            cache = make_cache_dir(cache or default_cache_dir(), "wheel cache")
            using.enter_context(cachelock.shared(cache))  # `soarpack cache clear` refuses until the copy is done
            fetch_into_cache(lock, cache, on_event)
            sources = [_cached(cache, w) for w in lock]
        names = []
        for src in sources:
            shutil.copyfile(src, dest / src.name)
            names.append(src.name)
    return sorted(names)


def resolve_lock(out: Path = LOCK_PATH, roots: Iterable[str] = LOCK_ROOTS, on_event: EventCallback = no_events) -> Path:
    """Maintainer tool: resolve the closure for the platform with pip and write the lock (network needed)."""
    log = lines_to(on_event, "wheels")
    with tempfile.TemporaryDirectory(prefix="soarpack-lock-") as tmp:
        tmp = Path(tmp)
        local = tmp / "local"
        py310 = find_python310()
        if py310 is None:
            raise WheelError("resolving the lock needs a CPython 3.10", "set SOARPACK_PYTHON310")
        # The sdist-only packages as wheels (their metadata is all pip needs) and a stub for the image's torch.
        sdist_pins = [r for r in roots if canonical(r.split("==")[0]) in SDIST_ONLY]
        log("building the sdist-only packages for metadata")
        _pip(py310, ["wheel", "--no-deps", "-w", str(local), "--no-binary", ",".join(SDIST_ONLY),
                     *sdist_pins, *[n for n in SDIST_ONLY if not any(canonical(p.split("==")[0]) == n for p in sdist_pins)]],
             "building the sdist-only packages")
        make_pure_wheel(local, "torch", f"{IMAGE_TORCH}+image")
        report = tmp / "report.json"
        # --isolated: resolve against PyPI alone, not a machine's local mirrors or find-links. pip evaluates
        # environment markers (`python_version < "3.11"`) on the interpreter that runs it, so that must be a 3.10.
        _pip(py310, ["install", "--isolated", "--dry-run", "--ignore-installed", "--report", str(report), "--target", str(tmp / "t"),
                              *_platform_args(), "--find-links", str(local), *roots, f"torch=={IMAGE_TORCH}"],
             "resolving the platform closure")
        data = json.loads(report.read_text())
    wheels = []
    for item in data["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if canonical(name) in NOT_BUNDLED:
            continue
        url = item["download_info"]["url"]
        if canonical(name) in SDIST_ONLY:
            wheels.append(LockedWheel(canonical(name), version, "sdist"))
        else:
            sha = (item["download_info"].get("archive_info", {}).get("hashes") or {}).get("sha256")
            wheels.append(LockedWheel(canonical(name), version, "pypi", url.rsplit("/", 1)[-1], sha))
    wheels.sort(key=lambda w: w.name)
    return atomic_write_json(out, {
        "comment": "Generated by soarpack.bundle.wheels.resolve_lock(); what NOT_BUNDLED names (torch, torchao) is left out on purpose.",
        "python": TARGET_PYTHON, "platforms": list(TARGET_PLATFORMS), "image_torch": IMAGE_TORCH, "roots": list(roots),
        "wheels": [w.__dict__ for w in wheels],
    })


def _wheel_metadata(path: Path):
    """The parsed METADATA of a wheel file."""
    from email.parser import Parser

    with zipfile.ZipFile(path) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if name is None:
            raise WheelError(f"{path.name} has no .dist-info/METADATA", "rebuild the wheel")
        return Parser().parsestr(zf.read(name).decode("utf-8", errors="replace"))


def image_compatibility_problems(wheel_paths: Sequence[Path]) -> List[str]:
    """One line per bundled wheel need that the platform cannot meet (Requires-Python, Requires-Dist).

    Needs are evaluated for CPython 3.10 on manylinux x86_64 against the bundled set itself, then the image's pins
    (IMAGE_PROVIDES); a package that NOT_BUNDLED names is left out on purpose and is not a problem. Metadata cannot
    catch an undeclared import-time break (torchao's was one): the image-stack rehearsal does.
    """
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.utils import parse_wheel_filename

    env = {"python_version": TARGET_PYTHON, "python_full_version": IMAGE_PYTHON_FULL, "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
    bundled = {}
    for path in wheel_paths:
        name, version, _, _ = parse_wheel_filename(Path(path).name)
        bundled[canonical(str(name))] = str(version)
    problems = []
    for path in sorted(wheel_paths, key=lambda p: Path(p).name):
        path = Path(path)
        meta = _wheel_metadata(path)
        rp = meta.get("Requires-Python")
        if rp:
            try:
                if not SpecifierSet(rp).contains(IMAGE_PYTHON_FULL, prereleases=True):
                    problems.append(f"{path.name}: Requires-Python {rp}, the image runs CPython {IMAGE_PYTHON_FULL}")
            except InvalidSpecifier:
                problems.append(f"{path.name}: unreadable Requires-Python {rp!r}")
        for line in meta.get_all("Requires-Dist") or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                problems.append(f"{path.name}: unreadable requirement {line!r}")
                continue
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = canonical(req.name)
            exempt = NOT_BUNDLED.get(dep)
            if (exempt and exempt.need_may_stay_unmet and dep not in bundled
                    and canonical(meta.get("Name", "")) in exempt.declared_by):
                continue
            have = bundled.get(dep) or IMAGE_PROVIDES.get(dep)
            where = "bundled" if dep in bundled else "the image's"
            if have is None:
                problems.append(f"{path.name}: requires {req}, which is neither bundled nor in the image")
            elif not req.specifier.contains(have, prereleases=True):
                problems.append(f"{path.name}: requires {req}, but {where} {dep} is {have}")
    return problems


def pip_check_problems(pip_check_output: str) -> List[str]:
    """The lines of `pip check` that are real problems: a need on a NOT_BUNDLED package is left out on purpose."""
    import re

    problems = []
    for line in pip_check_output.splitlines():
        m = (re.match(r"^\S+ \S+ requires ([A-Za-z0-9_.\-]+)", line)
             or re.match(r"^\S+ \S+ has requirement ([A-Za-z0-9_.\-]+)", line))
        if m and canonical(m.group(1)) in NOT_BUNDLED:
            continue
        if line.strip() and not line.startswith("No broken requirements"):
            problems.append(line.strip())
    return problems


def wheel_tag_problems(names: Sequence[str]) -> List[str]:
    """Wheels that CPython 3.10 on manylinux x86_64 (the platform) cannot install."""
    from packaging.utils import parse_wheel_filename

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


def not_installable_here(names: Sequence[str]) -> Optional[str]:
    """None when this interpreter can install every wheel; else why not."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    here = set(sys_tags())
    for name in names:
        _, _, _, tags = parse_wheel_filename(name)
        if not set(tags) & here:
            return (f"{name} is for the platform (CPython 3.10 manylinux x86_64), not this CPython "
                    f"{sys.version_info[0]}.{sys.version_info[1]}; the platform installs them")
    return None
