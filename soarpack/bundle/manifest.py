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
from typing import Annotated, Any, Dict, List, Literal, Optional, Union

from pydantic import Field

from soarpack.version import __version__
from soarpack.bundle.tarpack import iter_tree
from soarpack.errors import SoarpackError
from soarpack.placement.content import sha256_file
from soarpack.recipe.files import Located
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


class CalibrationSource(StrictModel):
    file: str
    rows: int = Field(ge=0)  # rows the file holds, as quantize reads them (soarpack.quant.calib.count_rows)
    tasks: Dict[str, Annotated[int, Field(ge=0)]] = {}  # rows per `task` field value


class CalibrationRecord(StrictModel):
    """What build recorded of the calibration: the rows the platform's quantize asks for (and who asked), and the
    rows each shipped file holds (soarpack.bundle.risks reads it; strict ints: a NaN or a negative count is no
    record)."""

    rows_asked: int = Field(ge=1)
    asked_by: Literal["cli", "recipe", "default"]  # build --rows (as quantize.extra_args), the recipe, the default
    builtin: bool
    sources: List[CalibrationSource]


class QuantizeEntry(StrictModel):
    recipe: str  # a built-in recipe name, or the bundle's recipe.toml
    recipe_name: str
    # "none": the recipe quantizes nothing and prepare_model.sh copies the original (written only then; absent means
    # "gptq", as in every bundle before it)
    method: Literal["gptq", "none"] = "gptq"
    calib: List[str]
    held_out: List[str] = []  # absent in bundles written before held-out files
    extra_args: List[str] = []
    calibration: Optional[CalibrationRecord] = None  # rows asked and shipped, and from where (soarpack.bundle.build)


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

    def recipe_source(self, root: Path) -> Located:
        """Where the recipe is, for the bundle unpacked at root: its own file, or a built-in (`recipe_is_bundled`)."""
        from soarpack.recipe.files import locate

        entry = self.quantize.recipe
        return Located(Path(root) / entry, None) if recipe_is_bundled(entry) else locate(entry, "recipe")

    def recipe_ref(self, root: Path) -> Union[str, Path]:
        """The recipe as the platform's `quantize --recipe` gets it: the bundle's recipe file, or a built-in name."""
        return Path(root) / self.quantize.recipe if recipe_is_bundled(self.quantize.recipe) else self.quantize.recipe

    def patched(self) -> set:
        """The patches the server runs with when they apply (none when the image's SGLang is used as is)."""
        return set(self.profile.patches) if self.sglang.mode in ("platform", "tree") else set()


def recipe_is_bundled(entry: str) -> bool:
    """The one rule for MANIFEST quantize.recipe: a path (soarpack.recipe.files.is_path; build writes a user's recipe
    as the bundle's recipe.toml) names the bundle's own file, anything else a built-in recipe. preprocess_model.py,
    which imports nothing of soarpack, asks whether the bundle holds the file: the same answer for every bundle
    build writes."""
    from soarpack.recipe.files import is_path

    return is_path(entry)


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
    is_int = isinstance(fmt, int) and not isinstance(fmt, bool)  # 1.0 and true equal 1 in Python, not in a format
    if not is_int or fmt != MANIFEST_FORMAT:
        newer = is_int and fmt > MANIFEST_FORMAT
        raise SoarpackError(f"{where}: MANIFEST.json format {fmt!r} is not one this soarpack ({__version__}) reads",
                            f"read it with the soarpack that wrote it ({data.get('soarpack_version')})" if newer else REBUILD)
    try:
        return validated(Manifest, data, f"{where}: MANIFEST.json ")
    except SoarpackError as exc:
        raise SoarpackError(exc.message, REBUILD) from None


def manifest_json(raw: Union[bytes, str], where: str) -> Any:
    """MANIFEST.json's bytes (or text) parsed, or one line saying why not: not UTF-8, not JSON, or nested deeper
    than the parser recurses (no MANIFEST soarpack writes is deeper than a few levels)."""
    try:
        return json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
    except UnicodeDecodeError as exc:
        raise SoarpackError(f"{where}: MANIFEST.json is not UTF-8 text (byte {exc.start})", REBUILD) from None
    except ValueError as exc:
        raise SoarpackError(f"{where}: MANIFEST.json is not valid JSON ({exc})", REBUILD) from None
    except RecursionError:
        raise SoarpackError(f"{where}: MANIFEST.json is nested too deep to be a manifest", REBUILD) from None


def read_manifest(root: Path) -> Manifest:
    path = Path(root) / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SoarpackError(f"{path} is missing", "this is not a bundle written by `soarpack build`") from None
    except OSError as exc:
        raise SoarpackError(f"cannot read {path}: {exc.strerror or exc}") from None
    return parse_manifest(manifest_json(raw, str(root)), str(root))


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
    problems += rows_problems(manifest.quantize)
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


# quantize's spellings of its calibration row count (soarpack.cli.quant): `--rows N`, `--rows=N`, `-n N`, `-nN`.
ROWS_FLAGS = ("--rows", "-n")


def extra_rows(extra: List[str]) -> Optional[str]:
    """The row count quantize.extra_args sets (the last one: it wins on quantize's command line), as written; None
    when it sets none."""
    found = None
    for i, token in enumerate(extra):
        if token in ROWS_FLAGS:
            found = extra[i + 1] if i + 1 < len(extra) else ""
        elif token.startswith("--rows="):
            found = token.split("=", 1)[1]
        elif token.startswith("-n") and not token.startswith("--"):
            found = token[2:]
    return found


def rows_problems(quantize: QuantizeEntry) -> List[str]:
    """Where quantize.extra_args's row count contradicts quantize.calibration's record of the rows asked: the
    platform quantizes with the extra_args' count, while the record (and the risks read from it) says another."""
    record = quantize.calibration
    if record is None:
        return []
    given = extra_rows(quantize.extra_args)
    if given is None:
        if record.asked_by == "cli":
            return [f"MANIFEST.json quantize.calibration says build --rows asked {record.rows_asked} rows, but "
                    "quantize.extra_args sets no --rows: the platform would quantize with the recipe's or the "
                    "default count"]
        return []
    if not given.isdigit() or int(given) < 1:
        return [f"MANIFEST.json quantize.extra_args sets --rows {given!r}, not a row count: the platform's quantize "
                "would refuse it"]
    if int(given) != record.rows_asked or record.asked_by != "cli":
        return [f"MANIFEST.json quantize.extra_args sets --rows {int(given)}, but quantize.calibration says "
                f"{record.rows_asked} rows asked ({record.asked_by}): the platform would quantize with "
                f"{int(given)}"]
    return []


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
