"""Old keyword names kept for one release: they still work and say their new name (a DeprecationWarning)."""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Dict, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def _warn(where: str, old: str, new: str, stacklevel: int) -> None:
    warnings.warn(f"{where}: {old}= is now {new}=; the old name goes in the next release", DeprecationWarning,
                  stacklevel=stacklevel + 1)


def deprecated_field(owner: str, old: str, new: str, old_value: Any, new_value: Any, default: Any = None) -> Any:
    """The value of a config field given under its old name (called from a dataclass's __post_init__)."""
    if new_value is not default and new_value != old_value:
        raise TypeError(f"{owner}: {old}= and {new}= are one setting given twice; pass only {new}=")
    _warn(owner, old, new, stacklevel=4)  # deprecated_field <- __post_init__ <- __init__ <- the caller
    return old_value


def renamed_keywords(**old_to_new: str) -> Callable[[F], F]:
    """`@renamed_keywords(num_samples="rows")`: the function also takes `num_samples=`, with a DeprecationWarning
    naming `rows=`. Its signature (help(), inspect) shows only the new names; the map is `fn.__renamed__`."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old not in kwargs:
                    continue
                value = kwargs.pop(old)
                if new in kwargs and kwargs[new] != value:
                    raise TypeError(f"{fn.__name__}(): {old}= and {new}= are one argument given twice; pass only {new}=")
                _warn(f"soarpack.{fn.__name__}()", old, new, stacklevel=2)
                kwargs[new] = value
            return fn(*args, **kwargs)

        wrapper.__renamed__ = dict(old_to_new)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return deco


def renamed_map(fn: Callable[..., Any]) -> Dict[str, str]:
    return dict(getattr(fn, "__renamed__", {}))
