"""The embedded API server is an oracle, not a copy: it parses selectors and applies merge
patches with its own code, never the gatekeeper's (issue 8), so that the gatekeeper's parser
bugs show up as differences instead of being shared."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import gatekeeper.testing

FORBIDDEN = ("gatekeeper.selectors", "gatekeeper.policy.patching")
PACKAGE = Path(gatekeeper.testing.__file__).parent


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_no_module_of_gatekeeper_testing_imports_the_gatekeepers_parsers() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 10
    for path in files:
        imported = _imported_modules(path)
        for forbidden in FORBIDDEN:
            assert not any(
                name == forbidden or name.startswith(forbidden + ".") for name in imported
            ), f"{path.relative_to(PACKAGE.parent.parent)} imports {forbidden}"


def test_importing_gatekeeper_testing_loads_neither_parser() -> None:
    code = (
        "import sys, gatekeeper.testing, gatekeeper.testing.apiserver\n"
        f"print(sorted(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
