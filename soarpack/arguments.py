"""The Python API's arguments checked against their annotations before any work, so a wrong type is one
ConfigError naming the argument (`soarpack.eval(): concurrency='4' must be an int`), not a TypeError from deep
inside. Only the annotations' own types are accepted: a bool is not an int, bytes are not a path."""

from __future__ import annotations

import collections.abc
import functools
import inspect
import os
import typing
from typing import Any, Callable, Dict, TypeVar

from soarpack.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])
_NONE = type(None)


def _resolved(kind: Any, namespace: Dict[str, Any]) -> Any:
    """`kind` with its forward references (`Union[str, "os.PathLike[str]"]`) evaluated, at any depth."""
    if isinstance(kind, str):
        return _resolved(eval(kind, namespace), namespace)  # an annotation of this package's own source
    if isinstance(kind, typing.ForwardRef):
        return _resolved(eval(kind.__forward_arg__, namespace), namespace)
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Union:
        return typing.Union[tuple(_resolved(a, namespace) for a in args)]
    if typing.get_origin(kind) in (collections.abc.Sequence, list, tuple) and args:
        return typing.Sequence[_resolved(args[0], namespace)]
    return kind


def _matches(value: Any, kind: Any) -> bool:
    origin = typing.get_origin(kind)
    if kind is Any:
        return True
    if origin is typing.Union:
        return any(_matches(value, arm) for arm in typing.get_args(kind))
    if kind is _NONE:
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:  # an int is a float, as in typing
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if origin is os.PathLike or kind is os.PathLike:
        return isinstance(value, os.PathLike) and isinstance(os.fspath(value), str)
    if origin is collections.abc.Callable:
        return callable(value)
    if origin in (collections.abc.Sequence, list, tuple):
        (item,) = typing.get_args(kind)[:1] or (Any,)
        return (isinstance(value, (list, tuple)) and all(_matches(v, item) for v in value))
    return isinstance(value, kind) if isinstance(kind, type) else True


def describe(kind: Any) -> str:
    """`kind` in words: "a path", "an int or None", "paths"."""
    origin = typing.get_origin(kind)
    if origin is typing.Union:
        arms = [describe(arm) for arm in typing.get_args(kind) if arm is not _NONE]
        arms = list(dict.fromkeys(a for a in arms if not (a == "a str" and "a path" in arms)))
        return " or ".join(arms + (["None"] if _NONE in typing.get_args(kind) else []))
    if origin is os.PathLike or kind is os.PathLike:
        return "a path"
    if origin in (collections.abc.Sequence, list, tuple):
        return f"a list of {describe(typing.get_args(kind)[0]).replace('a ', '', 1).replace('an ', '', 1)}s"
    if origin is collections.abc.Callable:
        return "a callable"
    name = getattr(kind, "__name__", str(kind))
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def checked_arguments(fn: F) -> F:
    """Decorate an API function: each argument given must match its annotation (read once, at first call)."""
    signature = inspect.signature(fn)
    hints: Dict[str, Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not hints:
            namespace = vars(inspect.getmodule(fn))
            hints.update({name: _resolved(annotation, namespace)
                          for name, annotation in fn.__annotations__.items() if name != "return"})
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:  # a missing or unknown argument: Python's own message names it
            raise ConfigError(f"soarpack.{fn.__name__}(): {exc}") from None
        for name, value in bound.arguments.items():
            kind = hints.get(name, Any)
            if not _matches(value, kind):
                raise ConfigError(f"soarpack.{fn.__name__}(): {name}={value!r:.80} must be {describe(kind)}",
                                  f"see help(soarpack.{fn.__name__})")
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
