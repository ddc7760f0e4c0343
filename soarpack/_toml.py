"""TOML reading on Python 3.10 (tomli) and 3.11+ (tomllib)."""

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised by the 3.10 CI leg
    import tomli as tomllib

loads = tomllib.loads
load = tomllib.load
TOMLDecodeError = tomllib.TOMLDecodeError
