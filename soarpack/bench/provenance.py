"""What a result file measured and with what: the server's model, the bundle, the tool versions."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any, Dict, Optional

import soarpack


def tool_versions() -> Dict[str, str]:
    """soarpack, Python and the HTTP client: what can change a measurement's numbers on the client side."""
    import httpx

    return {"soarpack": soarpack.__version__, "python": platform.python_version(), "httpx": httpx.__version__}


def measured(label: Optional[str], bundle: Optional[Path], served: Optional[dict]) -> Dict[str, Any]:
    """The `measured` block of an eval or bench result: the user's label, the bundle's identity (from its
    MANIFEST) and the server's model id and path."""
    out: Dict[str, Any] = {"label": label, "bundle": None, "served_model": served}
    if bundle is not None:
        from soarpack.bundle.summary import inspect_bundle

        summary = inspect_bundle(bundle)
        out["bundle"] = {k: summary[k] for k in ("path", "sha256", "profile", "recipe", "soarpack_version")}
    return out
