"""Our patch set for the OpenBMB `minicpm_sala` SGLang fork: find it, check a tree against it, apply it.

The patches are unified diffs relative to the fork's `python/` directory (`sglang/srt/...`), one file per
concern, named `NN-name.patch` (NN fixes the order). They live in the repo's top-level `sglang/`, and in an
installed package as `soarpack/sglang_patches/`. `fork-hashes.json` beside them records the sha256 of every
file they touch at each known fork commit, pristine and patched, so `check_tree` can say which commit a tree is.

Standard library only: `python -m soarpack.serve.patches apply|check` runs on the platform image without typer or
rich; `soarpack sglang apply|check` is the same through the CLI.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from soarpack.errors import ConfigError, SoarpackError
from soarpack.placement.cleanup import Log, remove_stale_temps, silent
from soarpack.placement.content import sha256_file
from soarpack.placement.journal import replace_files
from soarpack.placement.write import atomic_dir, atomic_write_json, prepare_output_dir
from soarpack.serve.unidiff import FileDiff, HunkResult, apply_file_diff, read_patch

HASHES_FILE = "fork-hashes.json"
PATCHES_ENV = "SOARPACK_SGLANG_PATCHES"


class PatchError(SoarpackError):
    """A patch that does not apply to the given SGLang tree."""


@dataclass
class Patch:
    name: str  # "fp8-kv-query" (the file name without the NN- prefix and .patch)
    path: Path
    description: str
    files: List[FileDiff]

    @property
    def requires(self) -> List[str]:
        """The patches this one is written on top of (a `Requires: a, b` line of its description)."""
        for line in self.description.splitlines():
            if line.lower().startswith("requires:"):
                return [n.strip() for n in line.split(":", 1)[1].split(",") if n.strip()]
        return []

    @property
    def summary(self) -> str:
        for line in self.description.splitlines():
            if line.lower().startswith("concern:"):
                return line.split(":", 1)[1].strip()
        return self.description.splitlines()[0] if self.description else ""


@dataclass
class FileStatus:
    path: str
    status: str  # "apply" | "applied" | "fail" | "missing"
    hunks: List[HunkResult] = field(default_factory=list)

    def problems(self) -> List[str]:
        if self.status == "missing":
            return [f"{self.path}: file not found in the tree"]
        out = [f"{self.path}:{h.line}: hunk {h.index} does not match ({h.detail})" for h in self.hunks if h.status == "fail"]
        if self.status == "fail" and not out:  # some hunks applied, others not: a half-patched file
            done = ", ".join(str(h.index) for h in self.hunks if h.status == "applied")
            out.append(f"{self.path}: partly patched already (hunks {done} present, the others not)")
        return out


@dataclass
class PatchStatus:
    name: str
    status: str  # "apply" | "applied" | "fail"
    files: List[FileStatus]

    def problems(self) -> List[str]:
        return [p for f in self.files for p in f.problems()]


@dataclass
class TreeReport:
    src: str
    commit: Optional[str]  # short commit id the touched files match, or None
    state: str  # "pristine" | "patched" | "mixed" | "unknown"
    patches: List[PatchStatus]
    differing: List[str] = field(default_factory=list)  # touched files that match no recorded commit
    written: List[str] = field(default_factory=list)  # apply only: files changed in the output

    @property
    def ok(self) -> bool:
        return all(p.status != "fail" for p in self.patches)

    def to_dict(self) -> dict:
        return asdict(self)


# -- locating the patch set ---------------------------------------------------------------------------------


def patch_dir() -> Path:
    """The directory holding the patch set: $SOARPACK_SGLANG_PATCHES, the repo's sglang/, or the packaged copy."""
    env = os.environ.get(PATCHES_ENV)
    here = Path(__file__).resolve().parent.parent  # .../soarpack
    return find_patch_dir(([Path(env)] if env else []) + [here.parent / "sglang", here / "sglang_patches"])


def find_patch_dir(candidates: Sequence[Path]) -> Path:
    """The first candidate that holds *.patch files."""
    for cand in candidates:
        if cand.is_dir() and any(cand.glob("*.patch")):
            return cand
    raise ConfigError(
        "no SGLang patch set found (looked in " + ", ".join(str(c) for c in candidates) + ")",
        "run from a soarpack checkout, or install a build that ships soarpack/sglang_patches/",
    )


def _patch_name(path: Path) -> str:
    stem = path.name[: -len(".patch")]
    head, sep, rest = stem.partition("-")
    return rest if sep and head.isdigit() else stem


def load_patches(directory: Optional[Path] = None) -> List[Patch]:
    directory = Path(directory) if directory else patch_dir()
    out = []
    for path in sorted(directory.glob("*.patch")):
        description, files = read_patch(path)
        if not files:
            raise ConfigError(f"{path}: no file diffs in the patch", "regenerate it with diff -u")
        out.append(Patch(_patch_name(path), path, description, files))
    return out


def list_patches(directory: Optional[Path] = None) -> List[str]:
    """Patch names in apply order."""
    return [p.name for p in load_patches(directory)]


def select_patches(names: Optional[Iterable[str]] = None, directory: Optional[Path] = None) -> List[Patch]:
    patches = load_patches(directory)
    if names is None:
        return patches
    wanted = list(names)
    known = {p.name for p in patches}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ConfigError(f"unknown SGLang patch {unknown[0]!r}", "known patches: " + ", ".join(sorted(known)))
    chosen = [p for p in patches if p.name in wanted]  # apply order, not the caller's order
    for name, missing in missing_requirements(wanted, patches):
        raise ConfigError(f"SGLang patch {name!r} is written on top of {', '.join(missing)}, which is not selected",
                          f"select {', '.join(missing)} too (patches = [{', '.join(repr(n) for n in [*missing, name])}])")
    return chosen


def missing_requirements(names: Iterable[str], patches: Optional[Sequence[Patch]] = None) -> List[tuple]:
    """(patch, [required patches not in `names`]) for each named patch whose `Requires:` are not all named."""
    names = list(names)
    patches = load_patches() if patches is None else patches
    by_name = {p.name: p for p in patches}
    out = []
    for name in names:
        missing = [r for r in (by_name[name].requires if name in by_name else []) if r not in names]
        if missing:
            out.append((name, missing))
    return out


# -- the tree -------------------------------------------------------------------------------------------------


def resolve_src(src: os.PathLike) -> Path:
    """Accept the fork's python/ dir (holds sglang/) or the repository root (holds python/sglang/)."""
    src = Path(src)
    if (src / "sglang").is_dir():
        return src
    if (src / "python" / "sglang").is_dir():
        return src / "python"
    if not src.exists():
        raise ConfigError(f"SGLang source {src} does not exist", "pass the fork's python/ directory")
    raise ConfigError(f"{src} holds no sglang/ package", "pass the fork's python/ directory (the one with sglang/ inside)")


def _read_text(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise PatchError(f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
                         "this is not the fork's file as released; restore it from the fork's checkout") from None


def _run(root: Path, patches: Sequence[Patch]) -> tuple:
    """Apply the patches in order to an in-memory copy of the touched files."""
    texts: Dict[str, Optional[str]] = {}
    statuses: List[PatchStatus] = []
    for patch in patches:
        files = []
        for fd in patch.files:
            if fd.path not in texts:
                p = root / fd.path
                texts[fd.path] = _read_text(p) if p.is_file() else None
            if texts[fd.path] is None:
                files.append(FileStatus(fd.path, "missing"))
                continue
            new_text, hunks = apply_file_diff(texts[fd.path], fd)
            kinds = {h.status for h in hunks}
            if kinds == {"applied"}:
                status = "applied"
            elif "fail" in kinds or kinds == {"apply", "applied"}:
                status = "fail"
            else:
                status = "apply"
            files.append(FileStatus(fd.path, status, hunks))
        kinds = {f.status for f in files}
        if kinds == {"applied"}:
            pstatus = "applied"
        elif kinds == {"apply"} or kinds == {"apply", "applied"}:
            pstatus = "apply"
        else:
            pstatus = "fail"
        if pstatus == "apply":  # only a patch that applies as a whole changes the in-memory texts
            for fd in patch.files:
                texts[fd.path], _ = apply_file_diff(texts[fd.path], fd)
        statuses.append(PatchStatus(patch.name, pstatus, files))
    return statuses, texts


def _known_hashes(directory: Path) -> Dict[str, Dict[str, Dict[str, str]]]:
    path = directory / HASHES_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))["commits"]


def _identify(root: Path, directory: Path, touched: Sequence[str]) -> tuple:
    commits = _known_hashes(directory)
    actual = {f: (sha256_file(root / f) if (root / f).is_file() else None) for f in touched}
    for commit, states in commits.items():
        for state in ("pristine", "patched"):
            want = states.get(state, {})
            if want and all(actual.get(f) == h for f, h in want.items()):
                return commit, state, []
    # Per file: a file may match one commit pristine and another patched (a half-applied tree).
    for commit, states in commits.items():
        per_file = []
        for f in touched:
            if actual[f] == states.get("pristine", {}).get(f):
                per_file.append("pristine")
            elif actual[f] == states.get("patched", {}).get(f):
                per_file.append("patched")
            else:
                per_file.append(None)
        if None not in per_file:
            return commit, "mixed", []
    differing = [f for f in touched if not any(actual[f] in (s.get("pristine", {}).get(f), s.get("patched", {}).get(f)) for s in commits.values())]
    return None, "unknown", differing


def _touched(patches: Sequence[Patch]) -> List[str]:
    seen: List[str] = []
    for p in patches:
        for fd in p.files:
            if fd.path not in seen:
                seen.append(fd.path)
    return seen


def check_tree(src: os.PathLike, names: Optional[Iterable[str]] = None, *, log: Log = silent) -> TreeReport:
    """Which patches apply / are applied / fail on `src`, and which fork commit its touched files match. An in-place
    apply that was killed is rolled back first, and said to `log`."""
    root = resolve_src(src)
    remove_stale_temps(root, log)
    directory = patch_dir()
    patches = select_patches(names, directory)
    statuses, _ = _run(root, patches)
    commit, state, differing = _identify(root, directory, _touched(load_patches(directory)))
    return TreeReport(str(root), commit, state, statuses, differing)


def _compile_check(text: str, rel: str) -> None:
    try:
        compile(text, rel, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise PatchError(f"{rel}:{exc.lineno}: does not compile after patching ({exc.msg})", "the patch and this tree disagree; report it") from None


def _failure(report: TreeReport) -> PatchError:
    lines = [f"{p.name}: {msg}" for p in report.patches if p.status == "fail" for msg in p.problems()]
    where = f" (tree matches fork commit {report.commit}, {report.state})" if report.commit else " (tree matches no known fork commit)"
    return PatchError(
        f"{len(lines)} patch problem(s) in {report.src}{where}: " + "; ".join(lines),
        "nothing was written; run `soarpack sglang check --src` for the full report",
    )


def apply_patches(
    src: os.PathLike,
    out: os.PathLike,
    names: Optional[Iterable[str]] = None,
    *,
    force: bool = False,
    verify_compile: bool = True,
    log: Log = silent,
) -> TreeReport:
    """Copy `src` to `out` with the patches applied, atomically; `out == src` patches in place.

    Every hunk is checked in memory before anything is written: a tree where any patch fails raises PatchError
    naming the file and line, and leaves `out` (or `src`) untouched. Already-applied patches are skipped.
    Every patched file must compile (verify_compile=False is for fixture trees made of code fragments).
    What cleaning up after a killed run did (an in-place apply rolled back, a temp removed) is said to `log`.
    """
    root = resolve_src(src)
    remove_stale_temps(root, log)  # an in-place apply that was killed is rolled back first
    out = Path(out)
    in_place = out.exists() and out.resolve() in (root.resolve(), Path(src).resolve())
    if not in_place:  # any other output lies outside the source: inside it would copy itself, around it replace it
        prepare_output_dir(out, force, inputs=[root], log=log)
    directory = patch_dir()
    patches = select_patches(names, directory)
    statuses, texts = _run(root, patches)
    commit, state, differing = _identify(root, directory, _touched(load_patches(directory)))
    report = TreeReport(str(root), commit, state, statuses, differing)
    if not report.ok:
        raise _failure(report)
    changed = {rel: text for rel, text in texts.items() if text is not None and text != _read_text(root / rel)}
    report.written = sorted(changed)

    if verify_compile:
        for rel, text in changed.items():
            _compile_check(text, rel)
    if in_place:
        try:
            replace_files({root / rel: text.encode("utf-8") for rel, text in changed.items()}, beside=root)
        except OSError as exc:
            raise PatchError(f"cannot replace {exc.filename or root}: {exc.strerror or exc}; nothing was changed",
                             "make the tree's files writable (permissions, chattr -i) and apply again") from None
        return report
    with atomic_dir(out, force=force, inputs=[root], log=log) as tmp:
        # An output inside the source (allowed while it replaces nothing) must not be copied into itself.
        own = {Path(os.path.realpath(p)) for p in (tmp, out, f"{tmp}.lock")}

        def skip(folder: str, names: List[str]) -> List[str]:
            return [n for n in names if n == "__pycache__" or Path(os.path.realpath(os.path.join(folder, n))) in own]

        copy_tree(root, tmp, ignore=skip)
        for rel, text in changed.items():
            target = tmp / rel
            mode = target.stat().st_mode
            target.unlink()  # never write through a hard link or symlink into the source tree
            target.write_text(text, encoding="utf-8", newline="")
            os.chmod(target, mode)
    return report


def copy_tree(src: Path, dst: Path, ignore=None) -> None:
    """shutil.copytree (links kept as links), raising the first file's OSError instead of shutil.Error's list of
    every failure as text: a full disk reads as ENOSPC (which the output's placement reports in one line), any
    other failure as that file and its reason."""
    try:
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, ignore=ignore)
    except shutil.Error as exc:
        failures = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
        why = " ".join(str(f[2]) for f in failures[:50] if isinstance(f, tuple) and len(f) == 3)
        if "[Errno 28]" in why or "No space left on device" in why:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst)) from None
        first = failures[0] if failures and isinstance(failures[0], tuple) and len(failures[0]) == 3 else None
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise PatchError(f"cannot copy {first[0] if first else src} into {dst}: {first[2] if first else exc}{more}",
                         "check that the source tree is readable and the output's disk writable") from None


def record_hashes(trees: Dict[str, os.PathLike], directory: Optional[Path] = None) -> Path:
    """Maintainer tool: write fork-hashes.json for pristine trees of known commits (commit id -> python/ dir)."""
    directory = Path(directory) if directory else patch_dir()
    patches = load_patches(directory)
    touched = _touched(patches)
    commits: Dict[str, Dict[str, Dict[str, str]]] = {}
    for commit, tree in trees.items():
        root = resolve_src(tree)
        statuses, texts = _run(root, patches)
        if any(s.status != "apply" for s in statuses):
            raise PatchError(f"the patch set does not apply cleanly to the {commit} tree at {root}", "fix the patches first")
        commits[commit] = {
            "pristine": {f: sha256_file(root / f) for f in touched},
            "patched": {f: hashlib.sha256(texts[f].encode("utf-8")).hexdigest() for f in touched},
        }
    return atomic_write_json(directory / HASHES_FILE, {"fork": "OpenBMB/sglang branch minicpm_sala (mirror tc-mb/sglang)", "commits": commits})


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Standard-library entry point for the platform: `python -m soarpack.serve.patches apply|check ...`.

    The same as `soarpack sglang apply|check` without typer or rich, for an environment that has neither.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m soarpack.serve.patches", description="Apply or check soarpack's SGLang patch set.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("apply", "check"):
        p = sub.add_parser(cmd)
        p.add_argument("--src", required=True, help="the fork's python/ directory")
        p.add_argument("--patch", action="append", help="only this patch (repeatable)")
        if cmd == "apply":
            p.add_argument("--out", required=True, help="where the patched copy goes (== --src: in place)")
            p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    ns = parser.parse_args(argv)
    try:
        if ns.cmd == "apply":
            report = apply_patches(ns.src, ns.out, ns.patch, force=ns.force)
        else:
            report = check_tree(ns.src, ns.patch)
    except SoarpackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(report.to_dict(), indent=2))
    if not report.ok:
        print("error: " + "; ".join(f"{p.name}: {m}" for p in report.patches for m in p.problems()), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through a subprocess in the tests
    raise SystemExit(main())
