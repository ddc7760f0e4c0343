"""soarpack: turn MiniCPM-SALA into a SOAR submission and measure it before you upload.

The Python API is the command line's, as functions with the same names and quiet by default:

    import soarpack
    tiny = soarpack.tiny_model("tiny", layers=2)
    result = soarpack.quantize(tiny, "tiny-w4", recipe="w4-full", rows=8, max_len=64, device="cpu")

soarpack.quantize, build, check, eval, bench, score, compare, diagnose, tiny_model: help(soarpack.NAME) for each.
They are imported on first use, so `import soarpack` stays fast and loads neither torch nor the CLI.
"""

__version__ = "0.1.0"

from soarpack.apinames import API_NAMES as _API_NAMES

# `from soarpack import *` leaves out `eval`: it would hide the builtin of that name (soarpack.eval still works)
__all__ = [name for name in _API_NAMES if name != "eval"]


def __getattr__(name: str):
    if name in ("bench", "diagnose"):  # subpackages that are also callable (soarpack.apinames)
        import importlib

        return importlib.import_module(f"soarpack.{name}")
    if name in _API_NAMES:
        import importlib

        value = getattr(importlib.import_module("soarpack.api"), name)
        globals()[name] = value  # found once: later reads skip __getattr__
        return value
    raise AttributeError(f"module 'soarpack' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_API_NAMES))
