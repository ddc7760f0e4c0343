"""MANIFEST.json: what a bundle holds and where it came from, with a sha256 and size for every file.

`Manifest` is the one record of a bundle: the builder writes it, `bundle.env` is rendered from it
(`render_bundle_env`), and every reader (check, inspect, eval and bench through inspect) reads it through
`parse_manifest`, which takes the MANIFESTs earlier soarpack versions wrote (format 1; before held-out files there
was no `quantize.held_out`) and refuses anything else in one line. A bundle's identity is one field, `Manifest.id`:
the sha256 of the MANIFEST's canonical JSON, which lists every file's sha256. The default tarball name carries its
first 8 characters; inspect, eval and bench show it.

preprocess_model.py reads `quantize` with the standard library only (it runs before soarpack's environment is
known to work); tests/test_bundle_manifest.py holds its reading equal to this model.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Dict, List, Literal, Optional, Union

from soarpack import __version__
from soarpack.bundle.tarpack import iter_tree
from soarpack.errors import SoarpackError
from soarpack.fsutil import sha256_file
from soarpack.schema import StrictModel, validated

MANIFEST_NAME = "MANIFEST.json"
MANIFEST_FORMAT = 1
REBUILD = "rebuild the bundle with `soarpack build`"
# quantize's flags that the manifest's own fields set: extra_args may not set them again (the last one would win).
OWNED_FLAGS = {"--recipe": "quantize.recipe", "--calib": "quantize.calib", "--held-out": "quantize.held_out"}


class FileEntry(StrictModel):
    sha256: str
    size: int


class ProfileEntry(StrictModel):
    name: str
    args: List[str]
    args_string: str
    patches: List[str] = []
    fallback: Optional[str] = None
    fallback_args: str


class QuantizeEntry(StrictModel):
    recipe: str  # a built-in recipe name, or the bundle's recipe.toml
    recipe_name: str
    # "none": the recipe quantizes nothing and prepare_model.sh copies the original (written only then; absent means
    # "gptq", as in every bundle before it)
    method: Literal["gptq", "none"] = "gptq"
    calib: List[str]
    held_out: List[str] = []  # absent in bundles written before held-out files
    extra_args: List[str] = []
    calibration: Optional[Dict[str, Any]] = None  # rows asked and shipped, and from where (soarpack.bundle.build)


class SglangEntry(StrictModel):
    mode: Literal["platform", "none", "tree"]
    patches: List[str] = []
    fork_commit: Optional[str] = None
    known_fork_commits: List[str] = []  # "platform" mode only
    applied_on: Optional[str] = None


class WheelsEntry(StrictModel):
    source: Literal["lock", "dir", "none"]
    files: List[str] = []


class Manifest(StrictModel):
    format: Literal[1]
    soarpack_version: str
    profile: ProfileEntry
    quantize: QuantizeEntry
    sglang: SglangEntry
    wheels: WheelsEntry
    files: Dict[str, FileEntry]
    total_size: int
    # What was known about the recipe and the profile when the bundle was built: {"recipe": [...], "profile": [...]}
    # of soarpack.evidence.Evidence entries (absent before verdicts; soarpack.bundle.risks reads it).
    evidence: Optional[Dict[str, List[Dict[str, Any]]]] = None

    def as_json(self) -> Dict[str, Any]:
        """The MANIFEST as written: only the keys it was given (an earlier version's MANIFEST stays as it was)."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def id(self) -> str:
        """The bundle's identity: sha256 of the MANIFEST's canonical JSON (it lists every file's sha256)."""
        text = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def recipe_ref(self, root: Path) -> Union[str, Path]:
        """The recipe as `load_recipe` takes it: the bundle's recipe file, or a built-in name."""
        from soarpack.recipe.files import is_path

        return Path(root) / self.quantize.recipe if is_path(self.quantize.recipe) else self.quantize.recipe

    def patched(self) -> set:
        """The patches the server runs with when they apply (none when the image's SGLang is used as is)."""
        return set(self.profile.patches) if self.sglang.mode in ("platform", "tree") else set()


def file_table(root: Path) -> dict[str, dict[str, Any]]:
    """{relative posix name: {sha256, size}} for every regular file under root except the manifest itself."""
    table = {}
    for path in iter_tree(root):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME or path.is_symlink() or not path.is_file():
            continue
        table[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    return table


def bundle_path_problem(name: Any) -> str | None:
    """Why a path the manifest names cannot be a file of the bundle (absolute, or leaving it); None when fine.
    preprocess_model.py applies the same rule with the standard library only."""
    if not isinstance(name, str) or not name:
        return "is not a relative path"
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or name.startswith("\\"):
        return "is an absolute path: a bundle names only its own files"
    if ".." in PurePosixPath(name).parts:
        return "leaves the bundle ('..'): a bundle names only its own files"
    return None


def render_manifest(root: Optional[Path], meta: dict[str, Any]) -> Manifest:
    """The Manifest of the staged tree at root: `meta` plus the file table (None: no files yet, the record that
    bundle.env is rendered from before the tree is complete)."""
    files = file_table(root) if root is not None else {}
    return validated(Manifest, {"format": MANIFEST_FORMAT, **meta, "files": files,
                                "total_size": sum(f["size"] for f in files.values())}, "MANIFEST.json: ")


def parse_manifest(data: Any, where: str) -> Manifest:
    """A Manifest from parsed JSON, or one line saying why not."""
    if not isinstance(data, dict):
        raise SoarpackError(f"{where}: MANIFEST.json is not an object", REBUILD)
    fmt = data.get("format")
    if fmt != MANIFEST_FORMAT:
        newer = isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > MANIFEST_FORMAT
        raise SoarpackError(f"{where}: MANIFEST.json format {fmt!r} is not one this soarpack ({__version__}) reads",
                            f"read it with the soarpack that wrote it ({data.get('soarpack_version')})" if newer else REBUILD)
    try:
        return validated(Manifest, data, f"{where}: MANIFEST.json ")
    except SoarpackError as exc:
        raise SoarpackError(exc.message, REBUILD) from None


def read_manifest(root: Path) -> Manifest:
    path = Path(root) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SoarpackError(f"{path} is missing", "this is not a bundle written by `soarpack build`") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SoarpackError(f"{path} is not valid JSON: {exc}", REBUILD) from None
    except OSError as exc:
        raise SoarpackError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_manifest(data, str(root))


def verify_files(root: Path, manifest: Manifest) -> list[str]:
    """Problems (one line each) between the tree under root and the manifest's file table; empty when they agree."""
    root = Path(root)
    actual = file_table(root)
    expected = {name: entry.model_dump() for name, entry in manifest.files.items()}
    problems = []
    for rel in sorted(set(expected) - set(actual)):
        problems.append(f"{rel}: listed in the manifest but missing")
    for rel in sorted(set(actual) - set(expected)):
        problems.append(f"{rel}: present but not in the manifest")
    for rel in sorted(set(actual) & set(expected)):
        if actual[rel] != expected[rel]:
            problems.append(f"{rel}: sha256/size differ from the manifest")
    return problems


# -- bundle.env, rendered from the same record -------------------------------------------------------------------


def bundle_env_values(manifest: Manifest) -> Dict[str, str]:
    """What prepare_env.sh reads from bundle.env, each value from the manifest."""
    return {
        "SOARPACK_BUNDLE_VERSION": manifest.soarpack_version,
        "SOARPACK_BUNDLE_PROFILE": manifest.profile.name,
        "SOARPACK_BUNDLE_SERVER_ARGS": manifest.profile.args_string,
        "SOARPACK_BUNDLE_FALLBACK_ARGS": manifest.profile.fallback_args,
        "SOARPACK_BUNDLE_SGLANG": manifest.sglang.mode,
        "SOARPACK_BUNDLE_PATCHES": " ".join(manifest.profile.patches),
    }


def render_bundle_env(manifest: Manifest) -> str:
    lines = ["# Written by soarpack build; sourced by prepare_env.sh."]
    lines += [f"{k}={shlex.quote(v)}" for k, v in bundle_env_values(manifest).items()]
    return "\n".join(lines) + "\n"


def consistency_problems(root: Path, manifest: Manifest) -> List[str]:
    """Where the MANIFEST disagrees with itself or with bundle.env (one line each; empty when they agree)."""
    from soarpack.bundle.layout import BUNDLE_ENV

    problems = []
    if shlex.join(manifest.profile.args) != manifest.profile.args_string:
        problems.append("MANIFEST.json profile.args_string is not profile.args joined")
    extra = manifest.quantize.extra_args
    for i, token in enumerate(extra):
        flag = token.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            value = token.split("=", 1)[1] if "=" in token else (extra[i + 1] if i + 1 < len(extra) else "")
            problems.append(f"MANIFEST.json quantize.extra_args sets {flag} {value}, but {OWNED_FLAGS[flag]} says "
                            f"{getattr(manifest.quantize, OWNED_FLAGS[flag].split('.')[1])!r}: the platform would "
                            f"quantize with the extra_args' value")
    env_path = Path(root) / BUNDLE_ENV
    try:
        env_text = env_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return problems + [f"{BUNDLE_ENV} cannot be read ({exc})"]
    if env_text != render_bundle_env(manifest):
        got = _assignments(env_text)
        for key, want in bundle_env_values(manifest).items():
            if got.get(key) != want:
                problems.append(f"{BUNDLE_ENV} {key}={got.get(key)!r}, but MANIFEST.json says {want!r}")
                break
        else:
            problems.append(f"{BUNDLE_ENV} is not what MANIFEST.json renders (extra lines or commands)")
    return problems


def _assignments(text: str) -> Dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.isidentifier():
            try:
                parts = shlex.split(value)
            except ValueError:
                parts = [value]
            out[key] = parts[0] if len(parts) == 1 else " ".join(parts)
    return out
