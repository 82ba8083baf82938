"""STYLE rule 4, checked on what is loaded, not on what is written: importing every module of
``gatekeeper.policy`` in a fresh interpreter loads nothing of the I/O side."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import gatekeeper.policy

FORBIDDEN = (
    "asyncio",
    "aiohttp",
    "socket",
    "ssl",
    "cryptography",
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
        "gatekeeper.policy.plan",
        "gatekeeper.policy.decision",
    } <= set(MODULES)


def test_policy_modules_load_nothing_of_the_io_side() -> None:
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, "gatekeeper.policy", *MODULES],
        capture_output=True,
        text=True,
        cwd=root,
        check=True,
    )
    loaded = json.loads(result.stdout)
    offending = [
        bad
        for bad in FORBIDDEN
        if any(name == bad or name.startswith(bad + ".") for name in loaded)
    ]
    assert offending == [], f"importing gatekeeper.policy loads {offending}"


# What the engine's own code (and every gatekeeper module it reaches) may not import at all:
# no I/O, no event loop, no clock, no logging. Checked on the import graph, so a module that a
# third-party library happens to load anyway (logging, time) is still caught when the engine
# imports it itself.
NOT_IMPORTED = ("aiohttp", "asyncio", "datetime", "logging", "os", "socket", "ssl", "time")


# The loader reads the policy files (and their includes) and logs a deprecated format: it is the
# policy's I/O, kept out of the engine's modules, which never import it.
ENGINE_MODULES = [name for name in MODULES if name != "gatekeeper.policy.loader"]


def test_policy_modules_import_no_io_clock_or_logging() -> None:
    import grimp

    graph = grimp.build_graph("gatekeeper", include_external_packages=True)
    chains = {
        (module, bad): graph.find_shortest_chain(importer=module, imported=bad)
        for module in ENGINE_MODULES
        for bad in NOT_IMPORTED
        if bad in graph.modules
    }
    found = {key: chain for key, chain in chains.items() if chain is not None}
    assert found == {}, f"the policy engine reaches {found}"


def test_the_pure_engine_contract_names_every_engine_module() -> None:
    """The import-linter contract lists the engine's modules one by one: none is left out."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["id"] == "pure-engine"]
    assert sorted(contract["source_modules"]) == ENGINE_MODULES
