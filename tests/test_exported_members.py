"""``__all__`` in every module, checked both ways (httpx's ``tests/test_exported_members.py``):
every name it lists exists, and every public name a module defines (or a package re-exports)
is listed in it; anything else takes the ``_`` prefix (STYLE rule 7)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import gatekeeper

MODULES = sorted(
    ["gatekeeper"]
    + [info.name for info in pkgutil.walk_packages(gatekeeper.__path__, "gatekeeper.")]
)
# Public names not exported, with why. Loggers are exempt by shape (``x = logging.getLogger``).
NOT_EXPORTED: dict[str, set[str]] = {
    # Modules of the embedded API server, whose own change names them: to be renamed there.
    "gatekeeper.apiserver._managed": {"Path"},
    "gatekeeper.apiserver._render": {"Cell"},
    "gatekeeper.apiserver._typed": {"OPAQUE_PARAMETERS_MAX"},
}


def _source(name: str) -> tuple[Path, ast.Module]:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    path = Path(spec.origin)
    return path, ast.parse(path.read_text(encoding="utf-8"))


def _is_logger(value: ast.expr | None) -> bool:
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr == "getLogger"
    )


def _public_names(path: Path, tree: ast.Module) -> set[str]:
    """Names the module binds at top level itself (and, for a package, re-exports)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and not _is_logger(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.update(() if _is_logger(node.value) else (node.target.id,))
        elif isinstance(node, ast.ImportFrom) and path.name == "__init__.py":
            names.update(alias.asname or alias.name for alias in node.names)
    names.discard("annotations")  # from __future__
    return {name for name in names if not name.startswith("_")}


def _declared(name: str, tree: ast.Module) -> list[str]:
    """``__all__`` as written (read from the source: ``__main__`` runs when imported)."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            value = ast.literal_eval(node.value)
            assert isinstance(value, list), name
            return value
    raise AssertionError(f"{name} has no __all__")


def test_every_module_is_found() -> None:
    expected = {"gatekeeper.proxy.pipeline", "gatekeeper.policy.plan", "gatekeeper.testing.harness"}
    assert expected <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_all_lists_exactly_the_public_names(name: str) -> None:
    path, tree = _source(name)
    declared = _declared(name, tree)
    assert len(declared) == len(set(declared)), f"{name}.__all__ repeats a name"
    public = _public_names(path, tree) - NOT_EXPORTED.get(name, set())
    assert sorted(public - set(declared)) == [], f"public in {name} but not in __all__"
    if not name.endswith("__main__"):
        module: ModuleType = importlib.import_module(name)
        assert [n for n in declared if not hasattr(module, n)] == [], f"{name}.__all__"
