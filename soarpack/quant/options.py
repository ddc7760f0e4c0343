"""The options of one quantization run, typed and validated before any work; their defaults are the only defaults
(the CLI, preprocess_model.py and the bundle read them from here).

Calibration settings (rows, max_len, seed, batch) are the recipe's (soarpack.recipe.calibration): CLI flag > the
recipe's `[calibration]` table > `CALIBRATION_DEFAULTS`, and the run report records which of the three set each value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, List, Literal, Optional

from pydantic import Field

from soarpack.recipe.calibration import (CALIBRATION_DEFAULTS, CalibrationOverrides,  # noqa: F401 - read from here too
                                          CalibrationSettings, resolve_calibration)
from soarpack.recipe.model import DEFAULT_RECIPE
from soarpack.schema import StrictModel, validated

LoosePath = Annotated[Path, Field(strict=False)]  # a str or a Path


HELD_OUT_ROWS = 4
HELD_OUT_MAX_LEN = 512


class QuantizeOptions(StrictModel):
    recipe: str = DEFAULT_RECIPE  # a built-in recipe name or a .toml path
    calib: Optional[List[LoosePath]] = None  # calibration files; None = the built-in prompts
    held_out: Optional[List[LoosePath]] = None  # held-out files; None = built-in, disjoint prompts
    calibration: CalibrationOverrides = CalibrationOverrides()
    held_out_rows: int = Field(HELD_OUT_ROWS, ge=1)
    device: str = "auto"
    force: bool = False
    log_file: Optional[LoosePath] = None
    # where GPTQModel's, torch's and transformers' own output goes while the run lasts: the log file (when there
    # is one) or the terminal's stderr
    library_output: Literal["log", "terminal"] = "log"
    sanity_max_loss: Optional[float] = Field(8.0, gt=0, allow_inf_nan=False)  # nats; a random 73k-vocab model sits
    # near ln(vocab) ≈ 11.2; not yet measured on the real model
    float_dtype: Literal["bfloat16", "float16"] = "bfloat16"
    auto_map: Literal["keep", "drop-config"] = "keep"
    offload_to_disk: bool = False
    quality: bool = True
    verify: bool = True
    engine: Literal["soarpack", "gptqmodel-defaults"] = "soarpack"
    shared_input_hessians: bool = True  # one Hessian per input tensor; False: one per module


# How each option is spelled on the command line, so a refusal names what the user typed.
FLAGS = {"rows": "--rows", "max_len": "--max-len", "seed": "--seed", "batch": "--batch", "recipe": "--recipe",
         "sanity_max_loss": "--max-sanity-loss", "device": "--device", "auto_map": "--auto-map",
         "log_file": "--log", "calib": "--calib", "held_out": "--held-out", "held_out_rows": "--held-out-rows"}


def quantize_options(**given: Any) -> QuantizeOptions:
    """QuantizeOptions from keyword arguments (calibration settings may be given flat: rows=..., batch=...);
    a bad value is refused with one line naming its flag."""
    flat = {k: given.pop(k) for k in list(given) if k in CalibrationOverrides.model_fields}
    overrides = validated(CalibrationOverrides, {k: v for k, v in flat.items() if v is not None}, "", FLAGS)
    return validated(QuantizeOptions, {**given, "calibration": overrides}, "", FLAGS)
