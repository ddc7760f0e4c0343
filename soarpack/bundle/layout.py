"""Names inside a bundle, shared by the builder, the checker and the entry scripts (which hard-code the same)."""

from __future__ import annotations

from pathlib import Path

from soarpack.facts import limits

PREPARE_ENV = "prepare_env.sh"
PREPARE_MODEL = "prepare_model.sh"
PREPROCESS = "preprocess_model.py"
SCRIPTS = (PREPARE_ENV, PREPARE_MODEL, PREPROCESS)
BUNDLE_ENV = "bundle.env"  # shell assignments sourced by prepare_env.sh
SRC_DIR = "src"  # soarpack's source: src/soarpack/, src/pyproject.toml, src/sglang/ (the patch set)
WHEELS_DIR = "wheels"
CALIB_DIR = "calib"
RECIPE_FILE = "recipe.toml"  # only when the recipe is a user file, not a built-in name
SGLANG_TREE = "sglang"  # only with --sglang-src DIR: the patched fork's python/ dir at sglang/python
REQUIRED = (*SCRIPTS, BUNDLE_ENV, "MANIFEST.json", f"{SRC_DIR}/soarpack/__init__.py")

# The platform's limit on the upload, and where we start warning.
MAX_BYTES = limits.UPLOAD_MAX_BYTES
WARN_BYTES = int(MAX_BYTES * limits.UPLOAD_WARN_FRACTION)

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # soarpack/, this file being soarpack/bundle/layout.py
REPO_DIR = PACKAGE_DIR.parent  # a checkout: holds the entry scripts, pyproject.toml and sglang/


def script_path(name: str) -> Path:
    """An entry script: the checkout's top-level copy, else the one a wheel install carries (setup.py)."""
    in_checkout = REPO_DIR / name
    return in_checkout if in_checkout.is_file() else PACKAGE_DIR / "bundle" / "entry" / name
