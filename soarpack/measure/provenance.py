"""What a result file measured and with what: the server's model, the bundle, the tool versions."""

from __future__ import annotations

import platform
from typing import Any, Dict, Optional

from soarpack.version import __version__


def tool_versions() -> Dict[str, str]:
    """soarpack, Python and the HTTP client: what can change a measurement's numbers on the client side."""
    import httpx

    return {"soarpack": __version__, "python": platform.python_version(), "httpx": httpx.__version__}


def measured(label: Optional[str], bundle: Optional[Dict[str, Any]], served: Optional[dict]) -> Dict[str, Any]:
    """The `measured` block of an eval or bench result: the user's label, the bundle's identity (the caller reads it
    from the bundle's MANIFEST: bench sits below bundle) and the server's model id and path."""
    keys = ("id", "path", "sha256", "profile", "recipe", "soarpack_version")
    return {"label": label, "bundle": {k: bundle.get(k) for k in keys} if bundle else None, "served_model": served}
