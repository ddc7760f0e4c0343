"""The calibration settings a recipe's `[calibration]` table may set, their defaults (stated here only), and how
they resolve: CLI flag > the recipe's `[calibration]` table > `CALIBRATION_DEFAULTS`; the run report records which
of the three set each value."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from pydantic import Field

from soarpack.schema import StrictModel


class CalibrationSettings(StrictModel):
    rows: int = Field(256, ge=1)  # at least 256, as peers advise (docs/evidence.md#calibration; docs/recipes.md)
    max_len: int = Field(2048, ge=8)  # tokens per row, left-truncated; must stay under the model's dense_len
    seed: int = Field(0, ge=0)
    batch: int = Field(4, ge=1)  # rows per forward; sorted by length so padding is small


class CalibrationOverrides(StrictModel):
    """A recipe's `[calibration]` table or the CLI's flags: only what was set."""

    rows: Optional[int] = Field(None, ge=1)
    max_len: Optional[int] = Field(None, ge=8)
    seed: Optional[int] = Field(None, ge=0)
    batch: Optional[int] = Field(None, ge=1)


CALIBRATION_DEFAULTS = CalibrationSettings()


def resolve_calibration(cli: CalibrationOverrides, recipe: Optional[CalibrationOverrides]
                        ) -> Tuple[CalibrationSettings, Dict[str, str]]:
    """CLI > recipe > default, per setting; also which of the three set each value."""
    values: Dict[str, int] = {}
    sources: Dict[str, str] = {}
    for name, default in CalibrationSettings().model_dump().items():
        for source, layer in (("cli", cli), ("recipe", recipe)):
            value = getattr(layer, name) if layer is not None else None
            if value is not None:
                values[name], sources[name] = value, source
                break
        else:
            values[name], sources[name] = default, "default"
    return CalibrationSettings(**values), sources
