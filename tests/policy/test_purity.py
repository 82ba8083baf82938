"""STYLE rule 4: the whole ``gatekeeper.policy`` package is pure. Its import contract
(pyproject, ``pure-engine``) names the package, not a list of modules; checked here on what is
loaded and on what the code calls, since the package may use ``datetime`` for arithmetic."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import gatekeeper.policy

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = (
    "asyncio",
    "aiohttp",
    "socket",
    "ssl",
    "cryptography",
    "jsonschema",
    "gatekeeper.policyfile",
    "gatekeeper.upstream.session",
    "gatekeeper.proxy.pipeline",
    "gatekeeper.listen.identity",
    "gatekeeper.cli.certs",
)
MODULES = sorted(
    f"gatekeeper.policy.{info.name}" for info in pkgutil.iter_modules(gatekeeper.policy.__path__)
)
PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def test_every_policy_module_is_found() -> None:
    assert {
        "gatekeeper.policy.engine",
        "gatekeeper.policy.build",
        "gatekeeper.policy.claims",
    } <= set(MODULES)


def test_policy_modules_load_nothing_of_the_io_side() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "gatekeeper.policy", *MODULES],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    loaded = json.loads(result.stdout)
    offending = [
        bad
        for bad in FORBIDDEN
        if any(name == bad or name.startswith(bad + ".") for name in loaded)
    ]
    assert offending == [], f"importing gatekeeper.policy loads {offending}"


def test_the_import_contract_names_the_whole_package() -> None:
    """No hand-kept module list: a module added to the package is checked as it lands."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["id"] == "pure-engine"]
    assert contract["source_modules"] == ["gatekeeper.policy"]
    assert {"os", "logging", "time", "asyncio", "socket"} <= set(contract["forbidden_modules"])


# Calls that read a clock, whatever module they come from (datetime.now(), date.today(),
# time.time(), loop.time(), …): the package computes with times it is given, never the current one.
CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "time_ns"}


def clock_calls(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in CLOCK_CALLS:
                found.append(f"{name}() at line {node.lineno}")
    return found


def test_no_policy_module_reads_the_clock() -> None:
    folder = Path(gatekeeper.policy.__path__[0])
    found = {
        path.name: calls
        for path in sorted(folder.glob("*.py"))
        if (calls := clock_calls(path.read_text()))
    }
    assert found == {}


@pytest.mark.parametrize(
    "code",
    [
        "datetime.now(timezone.utc)",
        "datetime.datetime.utcnow()",
        "date.today()",
        "time()",
        "loop.time()",
    ],
)
def test_the_clock_check_sees_a_clock_read(code: str) -> None:
    assert clock_calls(f"x = {code}\n")
