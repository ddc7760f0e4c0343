"""`soarpack build`: assemble the submission tree, write MANIFEST.json, pack it deterministically.

The tree:
    prepare_env.sh  prepare_model.sh  preprocess_model.py   the platform's entry points
    bundle.env       profile name, SGLANG_SERVER_ARGS, fallback args, SGLang mode (sourced by prepare_env.sh)
    MANIFEST.json    versions, profile, recipe, calibration, patches, wheels, sha256 + size of every file
    src/             soarpack's source (package, pyproject.toml, sglang/ patch set), put on the overlay's path
    calib/           calibration JSONL (the built-in prompts unless --calib is given) and heldout.jsonl (built-in
                     prompts of their own seed stream, for the sanity loss and KL; never calibration rows)
    wheels/          the quantization stack for CPython 3.10 manylinux x86_64 (unless --no-wheels)
    recipe.toml      only for --recipe FILE
    sglang/python/   only for --sglang-src DIR: the fork with our patches applied
Nothing in it depends on the clock or the user: the same inputs give a byte-identical tarball.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from soarpack.version import __version__
from soarpack.bundle import layout
from soarpack.bundle.manifest import MANIFEST_NAME, parse_manifest, render_bundle_env, render_manifest
from soarpack.bundle.risks import evidence_record, manifest_risks
from soarpack.bundle.secrets import check_input_names, scan_tree
from soarpack.bundle.tarpack import write_tarball
from soarpack.errors import ConfigError, SoarpackError
from soarpack.facts import image
from soarpack.placement.checks import ensure_writable_output
from soarpack.placement.write import atomic_write_json, atomic_write_text, placing
from soarpack.recipe.files import Located, locate
from soarpack.steps import Event, EventCallback, Runner, no_events, step

PLATFORM = "platform"
_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")


class BundleTooLargeError(SoarpackError):
    """The tarball exceeds the platform's upload limit."""


@dataclass
class BuildResult:
    path: Path
    size: int
    manifest: Dict[str, Any]  # MANIFEST.json as written
    id: str  # the bundle's identity (soarpack.bundle.manifest.Manifest.id)
    warnings: List[str] = field(default_factory=list)
    risks: List[Any] = field(default_factory=list)  # soarpack.bundle.risks.Risk: what the verdicts will say
    placed: str = "created"  # or "replaced", or "up-to-date": these very bytes were already there (placement.place)

    def to_dict(self) -> Dict[str, Any]:
        m = {k: v for k, v in self.manifest.items() if k != "files"}
        return {"path": str(self.path), "id": self.id, "size": self.size, "warnings": self.warnings,
                "risks": [r.to_dict() for r in self.risks], "manifest": m, "placed": self.placed}


DEFAULT_NAME_GLOB = "soarpack-*.tar.gz"


def content_hash(manifest: Dict[str, Any]) -> str:
    """The bundle identity of a MANIFEST (Manifest.id): one hash is one content."""
    return parse_manifest(manifest, "MANIFEST.json").id


def default_output(profile_name: str, recipe_name: str, digest: str) -> Path:
    """soarpack-PROFILE-RECIPE-HASH8.tar.gz: one name is one submission."""
    def clean(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "x"

    return Path(f"soarpack-{clean(profile_name)}-{clean(recipe_name)}-{digest[:8]}.tar.gz")


FUTURE_SLACK_S = 2.0  # a modification time further ahead of the clock than this was set, not written


def newest_bundle(folder: Path = Path("."), now: Optional[float] = None) -> Path:
    """The most recently written soarpack-*.tar.gz in `folder` (what `check` and `inspect` take by default).

    A bundle records no build time (the same inputs give the same bytes), so its file times decide, and only
    when they agree: the newest by modification time must also be the newest by status-change time (which no
    tool sets back or ahead: a copy with `cp -p`, `touch -d` or an unpacked archive moves only the former), and no
    candidate's modification time may lie in the future. Otherwise which bundle is newest is ambiguous: refused,
    naming the candidates, rather than guessed."""
    import time

    found = []
    for path in folder.glob(DEFAULT_NAME_GLOB):
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_file():
            found.append((path, st.st_mtime, st.st_ctime))
    if not found:
        raise ConfigError(f"no {DEFAULT_NAME_GLOB} in {folder.resolve()}", "run soarpack build first, or pass BUNDLE")
    if len(found) == 1:
        return found[0][0]
    now = time.time() if now is None else now
    by_mtime = sorted(found, key=lambda f: f[1])
    by_ctime = sorted(found, key=lambda f: f[2])
    future = [f[0].name for f in found if f[1] > now + FUTURE_SLACK_S]
    tie = by_mtime[-1][1] == by_mtime[-2][1]
    why = (f"{', '.join(future)} {'has' if len(future) == 1 else 'have'} a modification time in the future" if future
           else "two have the same modification time" if tie
           else f"{by_mtime[-1][0].name} was modified last but {by_ctime[-1][0].name} was written last"
           if by_mtime[-1][0] != by_ctime[-1][0] else None)
    if why:
        names = ", ".join(sorted(f[0].name for f in found))
        raise ConfigError(f"{len(found)} bundles in {folder.resolve()} and which is newest is unclear: {why} "
                          f"({names})", "pass BUNDLE, the .tar.gz to use")
    return by_mtime[-1][0]


def _copy_sources(stage: Path) -> None:
    from soarpack.serve.patches import patch_dir

    src = stage / layout.SRC_DIR
    shutil.copytree(layout.PACKAGE_DIR, src / "soarpack", ignore=_COPY_IGNORE)
    for name in ("pyproject.toml", "README.md"):
        if (layout.REPO_DIR / name).is_file():
            shutil.copyfile(layout.REPO_DIR / name, src / name)
    shutil.copytree(patch_dir(), src / "sglang", ignore=_COPY_IGNORE)
    for name in layout.SCRIPTS:
        path = layout.script_path(name)
        if not path.is_file():
            raise SoarpackError(f"entry script {path} is missing", "run soarpack build from a soarpack checkout")
        shutil.copyfile(path, stage / name)
        (stage / name).chmod(0o755)


def _recipe_entry(stage: Path, where: Located) -> tuple:
    """Validate the recipe; return (what the manifest names, the Recipe). A user's file ships as recipe.toml."""
    from soarpack.recipe.model import load_recipe

    rec = load_recipe(where)
    if where.user_file is not None:
        shutil.copyfile(where.user_file, stage / layout.RECIPE_FILE)
        return layout.RECIPE_FILE, rec
    return where.builtin, rec


def _calibration(stage: Path, calib: Sequence[Path], rows: Optional[int], rec: Any,
                 asked_rows: Optional[int] = None) -> tuple:
    """(calibration files, held-out files) as the manifest names them, and the rows asked for (what quantize
    resolves on the platform: `asked_rows` (build --rows, passed to it), else the recipe's, else the default)
    against the rows shipped, file by file. `rows`: how many built-in prompts to write (default: the rows asked)."""
    from soarpack.quant.calib import read_examples, write_builtin_calibration
    from soarpack.quant.calibinfo import file_rows
    from soarpack.quant.options import HELD_OUT_ROWS, CalibrationOverrides, resolve_calibration

    from soarpack.quant.calib import check_builtin_rows

    out_dir = stage / layout.CALIB_DIR
    out_dir.mkdir()
    settings, written_by = resolve_calibration(CalibrationOverrides(rows=rows if rows is not None else asked_rows),
                                               rec.calibration)
    # only build --rows reaches the platform's quantize (as MANIFEST quantize.extra_args)
    asked, asked_by = resolve_calibration(CalibrationOverrides(rows=asked_rows), rec.calibration)
    if not calib:  # refused before anything is generated when it cannot fit in the one file quantize reads
        who = {"cli": "build --rows" if rows is None else "calib_rows", "recipe": f"recipe {rec.name}'s [calibration]",
               "default": "soarpack's default"}[written_by["rows"]]
        check_builtin_rows(settings.rows, settings.seed, settings.max_len, who)
    write_builtin_calibration(out_dir / "heldout.jsonl", HELD_OUT_ROWS, settings.seed, settings.max_len, held_out=True)
    held_out = [f"{layout.CALIB_DIR}/heldout.jsonl"]
    if not calib:
        write_builtin_calibration(out_dir / "builtin.jsonl", settings.rows, settings.seed, settings.max_len, asked=who)
        names = [f"{layout.CALIB_DIR}/builtin.jsonl"]
    else:
        names = []
        for i, path in enumerate(calib):
            read_examples(path)  # a broken line stops the build here, with file and line, not on the platform
            name = f"{i:02d}-{Path(path).name}"
            shutil.copyfile(path, out_dir / name)
            names.append(f"{layout.CALIB_DIR}/{name}")
    origin = {"rows_asked": asked.rows, "asked_by": asked_by["rows"], "builtin": not calib,
              "sources": [file_rows(stage / n, n) for n in names]}
    return names, held_out, origin


def _sglang(stage: Path, sglang_src: Union[str, Path], patches: Sequence[str]) -> Dict[str, Any]:
    if str(sglang_src) == PLATFORM:
        from soarpack.serve.patches import HASHES_FILE, patch_dir

        try:  # the commits the patch set is known to apply to; prepare_env.sh logs which one the image has
            known = sorted(json.loads((patch_dir() / HASHES_FILE).read_text())["commits"])
        except (OSError, ValueError, KeyError):
            known = []
        return {"mode": PLATFORM if patches else "none", "patches": list(patches), "fork_commit": None,
                "known_fork_commits": known, "applied_on": "the image's fork, by prepare_env.sh" if patches else None}
    from soarpack.serve.patches import apply_patches, check_tree, resolve_src

    tree = stage / layout.SGLANG_TREE / "python"
    tree.parent.mkdir()
    if patches:
        report = apply_patches(sglang_src, tree, list(patches))
    else:
        shutil.copytree(resolve_src(Path(sglang_src)), tree, symlinks=True, ignore=_COPY_IGNORE)
        report = check_tree(tree, [])
    # The folder's name only: a local path would leak into the upload and break byte-identical rebuilds.
    return {"mode": "tree", "patches": list(patches), "fork_commit": report.commit, "applied_on": Path(sglang_src).name,
            "dropped_links": _drop_links_out_of_tree(tree)}


def links_out_of_tree(root: Path, within: Optional[Path] = None) -> List[str]:
    """'name -> target' for every symlink under root that is absolute or resolves outside `within` (default: root)."""
    real_root = os.path.realpath(within if within is not None else root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                continue
            target = os.readlink(path)
            resolved = os.path.realpath(path)
            if os.path.isabs(target) or os.path.commonpath([real_root, resolved]) != real_root:
                out.append(f"{os.path.relpath(path, root)} -> {target}")
    return sorted(out)


def _drop_links_out_of_tree(tree: Path) -> List[str]:
    """Remove from the staged tree the links into the rest of the fork's checkout (the real fork's python/ has
    one: a .clang-format into sgl-kernel/); in the bundle they would dangle. Return them as warnings."""
    dropped = links_out_of_tree(tree)
    for entry in dropped:
        os.unlink(tree / entry.split(" -> ", 1)[0])
    return [f"not shipped, it points outside the fork's python/ tree: {d}" for d in dropped]


def _check_sglang_src(sglang_src: Union[str, Path]) -> None:
    from soarpack.serve.patches import resolve_src

    if not Path(sglang_src).is_dir():
        raise ConfigError(f"--sglang-src {sglang_src} is not a directory", "pass the fork's checkout or 'platform'")
    tree = resolve_src(Path(sglang_src))
    # Links within the fork's own checkout are dropped at staging; anything that leads elsewhere is refused.
    bad = links_out_of_tree(tree, within=tree.resolve().parent)
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise ConfigError(f"--sglang-src {tree} holds a symlink out of the tree: {bad[0]}{more}",
                          "a bundle ships only the fork's own files; remove the link or ship the patch set ('platform')")


def _input_paths(b: "Build") -> List[Path]:
    """Every file or folder the build reads that a user named: the output may be none of them, nor inside one."""
    files = [w.user_file for w in (b.profile_at, b.recipe_at) if w.user_file is not None]
    folders = [Path(str(p)) for p in (None if str(b.sglang_src) == PLATFORM else b.sglang_src, b.wheel_dir)
               if p is not None]
    return files + folders + list(b.calib)


def lint_profile_for_bundle(profile, recipe, patched: Sequence[str]) -> List[str]:
    """Raise on lint errors in the profile's args; return the warnings as lines."""
    from soarpack.serve.lint import lint_args, raise_on_errors

    findings = lint_args(profile.args, recipe=recipe, patched=set(patched))
    raise_on_errors(findings, f"profile {profile.name}")
    return [f"{f.rule}: {f.message}" for f in findings if f.level != "error"]


def _fallback_findings(profile, recipe) -> List[str]:
    """Findings (all levels) for the fallback profile on the unpatched image; they do not stop the build."""
    from soarpack.serve.lint import lint_args

    out = [f"{f.level} {f.rule}: {f.message}" for f in lint_args(profile.args, recipe=recipe, patched=set())]
    if profile.patches:
        out.append(f"it needs patches ({', '.join(profile.patches)}) but is what runs when patching failed")
    return out


@dataclass
class Build:
    """What the steps share: the inputs, their references located once, and what earlier steps staged."""

    out: Optional[Path]
    profile_at: Located
    recipe_at: Located
    profile: Any  # soarpack.recipe.profile.Profile
    sglang_src: Union[str, Path]
    calib: List[Path]
    wheels: bool
    wheel_dir: Optional[Path]
    cache_dir: Optional[Path]
    calib_rows: Optional[int]
    rows: Optional[int]
    max_bytes: int
    warn_bytes: int
    force: bool
    on_event: EventCallback
    stage: Path
    inputs: List[Path] = field(default_factory=list)
    out_path: Optional[Path] = None
    fallback: Any = None  # the fallback Profile, if the profile names one
    warnings: List[str] = field(default_factory=list)
    recipe_entry: str = ""
    recipe: Any = None  # soarpack.recipe.model.Recipe
    calibration: tuple = ([], [], None)  # (calibration files, held-out files, the record), as the manifest names them
    sglang: Dict[str, Any] = field(default_factory=dict)
    wheel_names: List[str] = field(default_factory=list)
    wheel_source: str = "none"
    manifest: Any = None  # soarpack.bundle.manifest.Manifest
    size: int = 0
    placed: str = "created"

    def say(self, message: str) -> None:
        self.on_event(Event("info", "build", message))


@step("inputs")
def check_inputs(b: Build) -> None:
    """Every input refused before any work: the fork, the calibration files, the names, the output's folder."""
    if str(b.sglang_src) != PLATFORM:
        _check_sglang_src(b.sglang_src)
    for c in b.calib:
        if not c.exists():
            raise ConfigError(f"--calib {c} does not exist", "pass a JSONL or text file")
        if not c.is_file():  # a directory, a device or a pipe: the bundle ships a copy, read again on the platform
            raise ConfigError(f"--calib {c} is not a regular file", "pass a JSONL or text file (a bundle ships a copy "
                              "of it, so a device or a pipe cannot be one)")
    check_input_names(b.calib + ([b.recipe_at.user_file] if b.recipe_at.user_file is not None else []))
    if b.wheel_dir is not None and not b.wheels:
        raise ConfigError("--wheel-dir and --no-wheels contradict each other", "pass one of them")
    b.inputs = _input_paths(b)
    # without -o, a probe of the folder: the name comes from the content
    b.out_path = b.out if b.out is not None else default_output(b.profile.name, "recipe", "0" * 8)
    ensure_writable_output(b.out_path, what="-o", inputs=b.inputs, make_parent=True)
    from soarpack.recipe.profile import load_profile

    b.fallback = load_profile(b.profile.fallback) if b.profile.fallback else None


@step("recipe", needs=["inputs"])
def stage_recipe(b: Build) -> None:
    b.recipe_entry, b.recipe = _recipe_entry(b.stage, b.recipe_at)
    b.warnings += lint_profile_for_bundle(b.profile, b.recipe, b.profile.patches)
    if b.fallback is not None:
        b.warnings += [f"fallback {b.fallback.name}: {w}" for w in _fallback_findings(b.fallback, b.recipe)]
    b.say(f"profile {b.profile.name}: recipe {b.recipe_entry}, patches {', '.join(b.profile.patches) or 'none'}")


@step("sources", needs=["inputs"])
def stage_sources(b: Build) -> None:
    _copy_sources(b.stage)


@step("calibration", needs=["recipe"])
def stage_calibration(b: Build) -> None:
    rec = b.recipe
    if rec.quantizes:
        b.calibration = _calibration(b.stage, b.calib, b.calib_rows, rec, b.rows)
        b.say(calibration_line(b.calibration[2]))
        return
    # nothing to calibrate: prepare_model.sh copies the original checkpoint
    if b.calib or b.rows is not None:
        raise ConfigError(f"recipe {rec.name} quantizes nothing (method = \"none\"): "
                          f"{'--calib' if b.calib else '--rows'} has no use", "leave it out, or pick a GPTQ recipe")
    b.say(f"no calibration: recipe {rec.name} quantizes nothing; prepare_model.sh copies the original checkpoint")


@step("sglang", needs=["inputs"])
def stage_sglang(b: Build) -> None:
    b.sglang = _sglang(b.stage, b.sglang_src, b.profile.patches)
    b.warnings += b.sglang.pop("dropped_links", [])


@step("wheels", needs=["inputs"])
def stage_wheels(b: Build) -> None:
    from soarpack.bundle.wheels import WheelError, collect_wheels, image_compatibility_problems

    if not b.wheels:
        b.warnings.append("no wheels bundled (--no-wheels): the platform image lacks gptqmodel and transformers 5, "
                          "so prepare_model.sh will fail there; use this bundle for rehearsal only")
        return
    b.wheel_names = collect_wheels(b.stage / layout.WHEELS_DIR, cache=b.cache_dir, wheel_dir=b.wheel_dir,
                                   on_event=b.on_event)
    b.wheel_source = "dir" if b.wheel_dir else "lock"
    problems = image_compatibility_problems(sorted((b.stage / layout.WHEELS_DIR).glob("*.whl")))
    if problems:
        raise WheelError(f"{problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                         f"the platform image ({image.describe_short()}) cannot run this wheel set; "
                         "pin a release that supports it")


@step("manifest", needs=["recipe", "sources", "calibration", "sglang", "wheels"])
def write_manifest(b: Build) -> None:
    prof, rec = b.profile, b.recipe
    calib_names, held_out_names, calib_origin = b.calibration
    meta = {
        "soarpack_version": __version__,
        "profile": {"name": prof.name, "args": list(prof.args), "args_string": prof.args_string(),
                    "patches": list(prof.patches), "fallback": prof.fallback,
                    "fallback_args": (b.fallback or prof).args_string()},
        "quantize": {"recipe": b.recipe_entry, "recipe_name": rec.name, "calib": calib_names,
                     "held_out": held_out_names, "extra_args": quantize_extra_args(b.rows),
                     "calibration": calib_origin, **({} if rec.quantizes else {"method": "none"})},
        "evidence": evidence_record(rec, prof),
        "sglang": b.sglang,
        "wheels": {"source": b.wheel_source, "files": b.wheel_names},
    }
    # bundle.env and MANIFEST.json are one record: the env is rendered from the manifest's fields.
    atomic_write_text(b.stage / layout.BUNDLE_ENV, render_bundle_env(render_manifest(None, meta)))
    b.manifest = render_manifest(b.stage, meta)
    atomic_write_json(b.stage / MANIFEST_NAME, b.manifest.as_json())


@step("credentials", needs=["manifest"])
def scan_credentials(b: Build) -> None:
    scan_tree(b.stage)  # the finished tree, MANIFEST.json included: what check scans in the upload


@step("pack", needs=["credentials"])
def pack(b: Build) -> None:
    if b.out is None:
        b.out_path = default_output(b.profile.name, b.recipe.name, b.manifest.id)
        ensure_writable_output(b.out_path, what="-o", inputs=b.inputs)
    # Packed beside the target and placed only once it is complete and within the limit.
    with placing(b.out_path, force=b.force, inputs=b.inputs, what="-o", log=b.say) as packing:
        write_tarball(b.stage, packing.path)
        b.size = packing.path.stat().st_size
        if b.size > b.max_bytes:
            raise BundleTooLargeError(f"the bundle is {b.size / 1e9:.2f} GB, over the platform's "
                                      f"{b.max_bytes / 1e9:.2f} GB limit",
                                      "drop --sglang-src DIR (ship the patch set) or bundle fewer calibration files")
    b.placed = packing.placed.outcome
    if b.size > b.warn_bytes:
        b.warnings.append(f"the bundle is {b.size / 1e9:.2f} GB, close to the {b.max_bytes / 1e9:.2f} GB limit")


# The build, in order: each step says its own lines (the runner announces none), and the first that fails ends it.
STEPS = [check_inputs, stage_recipe, stage_sources, stage_calibration, stage_sglang, stage_wheels, write_manifest,
         scan_credentials, pack]


def build_bundle(
    out: Optional[Union[str, Path]] = None,
    *,
    profile: Optional[Union[str, Path, Located]] = None,
    recipe: Optional[Union[str, Path, Located]] = None,
    sglang_src: Union[str, Path] = PLATFORM,
    calib: Sequence[Union[str, Path]] = (),
    wheels: bool = True,
    wheel_dir: Optional[Union[str, Path]] = None,
    cache_dir: Optional[Union[str, Path]] = None,
    calib_rows: Optional[int] = None,  # built-in prompts written (tests); default: the rows asked
    rows: Optional[int] = None,  # calibration rows the platform's quantize asks for (build --rows); default: the
    # recipe's, else soarpack.quant.options.CALIBRATION_DEFAULTS
    max_bytes: int = layout.MAX_BYTES,
    warn_bytes: int = layout.WARN_BYTES,
    force: bool = False,
    on_event: EventCallback = no_events,
) -> BuildResult:
    """Build the submission tarball; every input is checked before the slow parts (wheels, packing).

    `out` None: soarpack-PROFILE-RECIPE-HASH8.tar.gz in the current folder, named after the content. An existing
    output with other bytes is replaced only with `force`; the same bytes are up to date (`placed`). Both are
    decided when the bundle is placed, so two builds to one name cannot both replace it."""
    from soarpack.recipe.profile import DEFAULT_PROFILE, load_profile

    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ConfigError(f"--rows {rows!r} is not a row count", "pass --rows N with N of 1 or more")
    # The references, located once here: the steps get where they are, never the strings again.
    profile_at = locate(profile or DEFAULT_PROFILE, "profile")
    prof = load_profile(profile_at)
    if recipe is None and prof.recipe is None:
        raise ConfigError(f"profile {prof.name} names no recipe", "pass --recipe FILE or pick a profile with a recipe")
    recipe_at = locate(recipe if recipe is not None else prof.recipe, "recipe")
    with tempfile.TemporaryDirectory(prefix="soarpack-build-") as tmp:
        b = Build(Path(out) if out is not None else None, profile_at, recipe_at, prof, sglang_src,
                  [Path(c) for c in calib], wheels, Path(wheel_dir) if wheel_dir else None,
                  Path(cache_dir) if cache_dir else None, calib_rows, rows, max_bytes, warn_bytes, force, on_event,
                  Path(tmp) / "bundle")
        b.stage.mkdir()
        Runner(STEPS, on_event, stop_at_failure=True, announce=False).run(b)
    for w in b.warnings:
        on_event(Event("problem", "build", w))
    risks = manifest_risks(b.manifest)
    for risk in risks:
        on_event(Event("info", "build", risk.line()))
    return BuildResult(b.out_path, b.size, b.manifest.as_json(), b.manifest.id, b.warnings, risks, b.placed)


# Who asked for the calibration rows (resolve_calibration's sources), as build, inspect and the risks say it.
ASKED_BY_WORDS = {"recipe": "by the recipe", "default": "soarpack's default", "cli": "by build --rows"}


def quantize_extra_args(rows: Optional[int]) -> List[str]:
    """The flags build adds to the platform's `soarpack quantize` (MANIFEST quantize.extra_args)."""
    return ["--rows", str(rows)] if rows is not None else []


def calibration_line(origin: Dict[str, Any]) -> str:
    """`calibration: 12 rows shipped of the 256 asked (by the recipe), from calib/00-mine.jsonl (12 rows)`."""
    from soarpack.quant.calibinfo import where_from

    shipped = sum(s["rows"] for s in origin["sources"])
    by = ASKED_BY_WORDS.get(origin["asked_by"], origin["asked_by"])
    return (f"calibration: {shipped} rows shipped of the {origin['rows_asked']} asked ({by}), from "
            + ("the built-in synthetic prompts, " if origin["builtin"] else "") + where_from(origin["sources"]))

