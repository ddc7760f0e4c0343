"""soarpack: turn MiniCPM-SALA into a SOAR submission and measure it before you upload.

The Python API is the command line's, as functions with the same names and quiet by default:

    import soarpack
    tiny = soarpack.tiny_model("tiny", layers=2)
    result = soarpack.quantize(tiny, "tiny-w4", recipe="w4-full", rows=8, max_len=64, device="cpu")

soarpack.quantize, build, check, eval, bench, score, compare, diagnose, tiny_model: help(soarpack.NAME) for each.
They are imported on first use, so `import soarpack` stays fast and loads neither torch nor the CLI.

This file is the API's face and sits above everything: no module of soarpack imports it. No subpackage bears an
API function's name (the measurements are soarpack.measure, the diagnosis soarpack.diagnosis), so importing one
never rebinds soarpack.bench or soarpack.diagnose.
"""

from soarpack.version import __version__

API_NAMES = ("quantize", "build", "check", "eval", "bench", "score", "compare", "diagnose", "tiny_model")

# `from soarpack import *` leaves out `eval`: it would hide the builtin of that name (soarpack.eval still works)
__all__ = [name for name in API_NAMES if name != "eval"]


def __getattr__(name: str):
    if name in API_NAMES:
        from soarpack import api

        value = getattr(api, name)
        globals()[name] = value  # found once: later reads skip __getattr__
        return value
    raise AttributeError(f"module 'soarpack' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(API_NAMES))
