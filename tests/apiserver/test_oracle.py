"""The embedded API server is an oracle, not a copy: it imports nothing of the gatekeeper (it
parses selectors and applies merge patches with its own code), so that the gatekeeper's parser
bugs show up as differences instead of being shared. Import-linter checks the same in CI
(pyproject ``[tool.importlinter]``, contract ``apiserver``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gatekeeper.apiserver

FORBIDDEN = ("gatekeeper.codec.selectors", "gatekeeper.policy.patching")
PACKAGE = Path(gatekeeper.apiserver.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_no_module_of_the_embedded_api_server_imports_the_gatekeeper() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        for name in _imported_modules(path):
            if name == "gatekeeper" or name.startswith("gatekeeper."):
                assert name.startswith("gatekeeper.apiserver"), (
                    f"{path.relative_to(PACKAGE.parent.parent)} imports {name}"
                )


def test_importing_gatekeeper_testing_loads_neither_parser() -> None:
    code = (
        "import sys, gatekeeper.apiserver\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
