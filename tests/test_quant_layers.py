"""Import boundaries, read from the source (AST), not from what happens to be loaded."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "soarpack"

# Lower layers never import higher ones. Modules at the package root sit at the bottom.
LAYERS = {
    "__init__": 0, "errors": 0, "_toml": 0, "facts": 0, "schema": 0, "steps": 0, "printable": 0, "fsutil": 1, "inputs": 1,
    "evidence": 1, "cachelock": 0, "cachemark": 1, "imagestack": 1, "cache": 1, "envinfo": 1, "sala": 2, "recipe": 3, "quant": 4,
    "serve": 5, "bench": 5, "kernels": 5, "bundle": 6, "diagnose": 6, "rehearse": 7, "api": 8, "cli": 9, "__main__": 10,
    "apinames": 0, "deprecation": 0, "arguments": 0, "asyncrun": 0, "request": 1, "commands": 7,
}


def imports() -> Iterator[Tuple[Path, str]]:
    """(file, absolute module name) for every import in soarpack/, relative imports resolved."""
    for path in sorted(PACKAGE.rglob("*.py")):
        package = ["soarpack", *path.relative_to(PACKAGE).parent.parts]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, alias.name
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                yield path, module
                for alias in node.names:  # `from soarpack import fsutil` imports a module too
                    yield path, f"{module}.{alias.name}"


def _top(name: str) -> str:
    return name.split(".")[1] if name.startswith("soarpack.") else ""


def test_only_the_engine_imports_gptqmodel():
    offenders = sorted({str(p.relative_to(PACKAGE)) for p, m in imports()
                        if m.split(".")[0] == "gptqmodel"} - {"quant/engine.py"})
    assert offenders == []
    assert any(m.startswith("gptqmodel") for p, m in imports() if p.name == "engine.py")  # the check can see it


@pytest.mark.parametrize("forbidden", ["gptqmodel", "transformers.modeling_utils", "transformers.PreTrainedModel",
                                       "transformers.modeling_outputs"])
def test_sala_stays_plain_pytorch(forbidden):
    offenders = [str(p.relative_to(PACKAGE)) for p, m in imports()
                 if p.relative_to(PACKAGE).parts[0] == "sala" and (m == forbidden or m.startswith(forbidden + "."))]
    assert offenders == []


def test_packages_import_downward_only():
    upward = []
    for path, module in imports():
        rel = path.relative_to(PACKAGE)
        src = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        dst = _top(module)
        if dst in LAYERS and dst != src and LAYERS[dst] > LAYERS[src]:
            upward.append(f"{rel} imports {module}")
    assert upward == []
    assert set(LAYERS) >= {p.stem if p.parent == PACKAGE else p.relative_to(PACKAGE).parts[0]
                           for p in PACKAGE.rglob("*.py")}, "a new package needs a place in LAYERS"
