"""The names of soarpack's Python API (soarpack.api), for the package root's lazy attributes.

`bench` and `diagnose` are also subpackages (soarpack.bench, soarpack.diagnose): Python binds a subpackage to its
parent's attribute when it is imported, so those two stay modules that are also callable: `soarpack.bench(...)`
runs soarpack.api.bench, and `soarpack.bench.speed` is still the module.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

API_NAMES = ("quantize", "build", "check", "eval", "bench", "score", "compare", "diagnose", "tiny_model")


class CallableModule(types.ModuleType):
    """A subpackage that is also the API function of its name: called, it runs soarpack.api.NAME."""

    def _api_function(self) -> Any:
        return getattr(importlib.import_module("soarpack.api"), self.__name__.rsplit(".", 1)[1])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._api_function()(*args, **kwargs)

    @property
    def __signature__(self) -> Any:
        import inspect

        return inspect.signature(self._api_function())

    @property  # type: ignore[override]
    def __doc__(self) -> str:  # help(soarpack.bench) shows the function first, then the package
        import inspect

        name = self.__name__.rsplit(".", 1)[1]
        return (f"Called, soarpack.{name}(...) is soarpack.api.{name}:\n\n{inspect.getdoc(self._api_function())}"
                f"\n\nThe package {self.__name__}: {self.__dict__.get('__doc__') or ''}")


def make_callable(module_name: str) -> None:
    """Called at the end of a subpackage's __init__ whose name is an API function."""
    sys.modules[module_name].__class__ = CallableModule
