"""Import boundaries, read from the source (AST), not from what happens to be loaded."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable, Iterator, List, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "soarpack"

# Lower layers never import higher ones. Modules at the package root sit at the bottom, except the root itself
# (`__init__`: the API's face, which imports the API lazily and is imported by nothing inside soarpack).
LAYERS = {
    "errors": 0, "_toml": 0, "facts": 0, "schema": 0, "steps": 0, "printable": 0, "version": 0, "deprecation": 0,
    "cachelock": 0, "placement": 1, "inputs": 1, "evidence": 1, "cachemark": 1, "imagestack": 1, "cache": 1,
    "envinfo": 1, "sala": 2, "recipe": 3, "quant": 4, "serve": 5, "kernels": 5, "measure": 6, "bundle": 7,
    "diagnosis": 7, "rehearse": 8, "api": 9, "cli": 10, "__main__": 11, "__init__": 12,
    "arguments": 0, "asyncrun": 0, "request": 1, "commands": 8,
}
IMPORT_FUNCTIONS = {"import_module", "__import__"}  # importlib.import_module("soarpack.x"), __import__("soarpack.x")


def _is_submodule(module: str) -> bool:
    """Whether soarpack.a.b names a file or a package of the source tree (not a name defined in a module)."""
    parts = module.split(".")[1:]
    return parts != [] and ((PACKAGE.joinpath(*parts).with_suffix(".py")).is_file()
                            or PACKAGE.joinpath(*parts, "__init__.py").is_file())


def imports_of(source: str, package: List[str]) -> Iterator[str]:
    """The absolute module names that `source`, a module of the package `package` (["soarpack", "bundle"]),
    imports: import statements, relative ones resolved, and import_module/__import__ calls with a literal name.
    `from soarpack import api` imports soarpack.api; `from soarpack import __version__` imports the root."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [f"{module}.{alias.name}" for alias in node.names]
            yield from [n for n in names if _is_submodule(n)]
            if not all(_is_submodule(n) for n in names):
                yield module
        elif isinstance(node, ast.Call) and _called_name(node.func) in IMPORT_FUNCTIONS and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                name = first.value
                if name.startswith("."):  # import_module(".x", __package__): relative to this package
                    level = len(name) - len(name.lstrip("."))
                    name = ".".join(package[: len(package) - level + 1] + [name.lstrip(".")])
                yield name


def _called_name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _package_of(path: Path) -> List[str]:
    return ["soarpack", *path.relative_to(PACKAGE).parent.parts]


def imports() -> Iterator[Tuple[Path, str]]:
    """(file, absolute module name) for every import in soarpack/."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for module in imports_of(path.read_text(encoding="utf-8"), _package_of(path)):
            yield path, module


def _top(name: str) -> str:
    """The LAYERS key of a module name: soarpack.bundle.build -> bundle; the bare root -> __init__."""
    if name == "soarpack":
        return "__init__"
    return name.split(".")[1] if name.startswith("soarpack.") else ""


def _layer_of(rel: Path) -> str:
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def upward(pairs: Iterable[Tuple[Path, str]]) -> List[str]:
    """'FILE imports MODULE' for each import from a lower layer to a higher one."""
    found = []
    for path, module in pairs:
        rel = path.relative_to(PACKAGE)
        src, dst = _layer_of(rel), _top(module)
        if dst in LAYERS and dst != src and LAYERS[dst] > LAYERS[src]:
            found.append(f"{rel} imports {module}")
    return found


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
    assert upward(imports()) == []
    assert set(LAYERS) >= {p.stem if p.parent == PACKAGE else p.relative_to(PACKAGE).parts[0]
                           for p in PACKAGE.rglob("*.py")}, "a new package needs a place in LAYERS"


SYNTHETIC = """
import importlib
from soarpack import cachelock
from soarpack.errors import SoarpackError

def later():
    importlib.import_module("soarpack.cli")
    __import__("soarpack.api")
    from importlib import import_module
    import_module(".gpu", __package__)
"""


def test_the_check_sees_dynamic_imports_and_the_root():
    """Fed a synthetic module of soarpack.facts (layer 0): the import_module and __import__ calls with literal names
    are upward, `from soarpack import __version__` imports the root (above all), a submodule import is not."""
    facts = PACKAGE / "facts" / "synthetic.py"
    assert list(imports_of(SYNTHETIC, ["soarpack", "facts"])) == [
        "importlib", "soarpack.cachelock", "soarpack.errors", "importlib", "soarpack.cli", "soarpack.api",
        "soarpack.facts.gpu"]
    found = upward((facts, m) for m in imports_of(SYNTHETIC, ["soarpack", "facts"]))
    assert found == ["facts/synthetic.py imports soarpack.cli", "facts/synthetic.py imports soarpack.api"]
    root = upward((facts, m) for m in imports_of("from soarpack import __version__\nimport soarpack\n",
                                                  ["soarpack", "facts"]))
    assert root == ["facts/synthetic.py imports soarpack", "facts/synthetic.py imports soarpack"]
