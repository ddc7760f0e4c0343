"""`soarpack build` / `soarpack.build()` and `soarpack check` / `soarpack.check()`: their requests, declared once
(soarpack.request derives the commands' options, the API's signatures and help, and the README's rows)."""

from __future__ import annotations

from typing import Optional

from soarpack.facts import image, scoring as platform_scoring
from soarpack.recipe.calibration import CALIBRATION_DEFAULTS
from soarpack.request import LoosePath, Names, Option, PathList, Request

BUNDLE_HELP = "The .tar.gz written by soarpack build; default: the newest soarpack-*.tar.gz here."


class BuildRequest(Request):
    profile: Optional[str] = Option(None, "--profile", metavar="NAME|FILE",
                                    help="Serving profile (soarpack profiles); default: the default profile.")
    recipe: Optional[str] = Option(None, "--recipe", metavar="NAME|FILE",
                                   help="Quantization recipe instead of the profile's.")
    sglang_src: Optional[LoosePath] = Option(None, "--sglang-src", metavar="DIR",
                                             help="Ship this fork checkout, patched. Default: ship the patch set, "
                                                  "applied to the image's fork on the platform.")
    calib: PathList = Option(None, "--calib", metavar="FILE",
                             help="Calibration file to ship (repeatable); default: built-in prompts. Formats: "
                                  "soarpack calib --help.")
    rows: Optional[int] = Option(None, "-n", "--rows", metavar="N", min=1,
                                 help="Calibration rows the platform's quantize asks for (its --rows; recorded in "
                                      f"MANIFEST.json). Default: the recipe's, else {CALIBRATION_DEFAULTS.rows}.")
    wheels: bool = Option(True, "--wheels/--no-wheels",
                          help="Bundle the quantization stack as CPython 3.10 wheels (cached once).")
    wheel_dir: Optional[LoosePath] = Option(None, "--wheel-dir", metavar="DIR",
                                            help="Bundle exactly the wheels of this folder instead.")
    output: Optional[LoosePath] = Option(None, "-o", "--output", metavar="FILE", renamed_from=("out",),
                                         help="The tarball to write; default: soarpack-PROFILE-RECIPE-HASH.tar.gz, "
                                              "HASH from the content (one name, one submission).")
    force: bool = Option(False, "--force", help="Replace an existing output.")


class CheckRequest(Request):
    bundle: Optional[LoosePath] = Option(None, argument=True, metavar="BUNDLE", help=BUNDLE_HELP)
    rehearse: bool = Option(True, "--rehearse/--no-rehearse", help="Source prepare_env.sh and quantize a tiny model.")
    sglang_src: Optional[LoosePath] = Option(None, "--sglang-src", metavar="DIR", renamed_from=("sglang_fork",),
                                             old_flags=("--sglang-fork",),
                                             help="A checkout of the image's SGLang fork, to rehearse patching.")
    keep: Optional[LoosePath] = Option(None, "--keep", metavar="DIR",
                                       help="Rehearse in this folder and keep it (logs, overlay venv).")
    dev_stack: bool = Option(False, "--dev-stack",
                             help="Rehearse on this environment's Python instead of the image's stack "
                                  f"({image.describe_short()}): faster, but no proof for the platform.")
    accept_risk: Names = Option((), "--accept-risk", metavar="NAME",
                                help="Upload although this risk (a name the risk lines print) blocks; repeatable. "
                                     "It is still printed.")
    strict: bool = Option(False, "--strict", help="Exit 1 for any risk not accepted, not only a measured ori at or "
                                                  f"below {platform_scoring.FULL_CREDIT_ORI:g}.")
