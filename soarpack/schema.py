"""Typed validation at the boundary: pydantic models in strict mode (an int is never a float or a bool, a bound is
finite), turned into one-line ConfigErrors that name the setting and the value given."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from soarpack.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def validated(model: Type[M], data: Mapping[str, Any], where: str, names: Optional[Dict[str, str]] = None) -> M:
    """`model(**data)`, or a ConfigError naming the first bad setting (by `names[field]` when given, e.g. a flag)."""
    try:
        return model(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"]]
        name = (names or {}).get(loc[0], loc[0]) if loc else "value"
        setting = " ".join([name, *(f"[{p}]" for p in loc[1:])]) if loc else name
        given = "missing" if err["type"] == "missing" else repr(err.get("input"))
        is_flag = setting.startswith("--")
        raise ConfigError(f"{where}{setting}{' ' if is_flag else ' = '}{given}: "
                          f"{err['msg'][0].lower()}{err['msg'][1:]}") from None
