"""Shared fixtures: throwaway PKI, the embedded API server as upstream, a running gatekeeper.

The helpers behind them ship in :mod:`gatekeeper.testing`; test modules import from there.
Tests marked ``kubectl`` are skipped when kubectl is not installed, the only reason a test may
skip; when the environment variable ``CI`` is set, every skip is reported as a failure instead,
so a CI run cannot pass on tests that did not run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from gatekeeper.apiserver import APIServer
from gatekeeper.cli.served import served_kinds
from gatekeeper.policy import Policy
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import (
    GPU,
    KUBECTL,
    NIC,
    NODE_TOKEN,
    PKI,
    Kubectl,
    Running,
    running_gatekeeper,
    write_kubeconfig,
)

# Property tests: "ci" is bounded to a few seconds; GATEKEEPER_HYPOTHESIS_PROFILE=long (or
# pytest --hypothesis-profile=long) runs far more examples (docs/development.md#property-tests).
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("GATEKEEPER_HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kubectl: needs the kubectl binary on PATH")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if KUBECTL is None:
        skip = pytest.mark.skip(reason="kubectl is not installed (not on the PATH)")
        for item in items:
            if "kubectl" in item.keywords:
                item.add_marker(skip)


def _no_skips_under_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Under ``CI``, a skip is a failure that says what was skipped and why."""
    if not os.environ.get("CI") or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    report.outcome = "failed"
    report.longrepr = f"skipped, and no skip is allowed under CI (CI is set): {reason}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    _no_skips_under_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    report = yield
    _no_skips_under_ci(report)
    return report


@pytest.fixture(scope="session")
def pki() -> Iterator[PKI]:
    directory = Path(tempfile.mkdtemp(prefix="gk-pki-"))
    yield PKI.create(directory)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def policy() -> Policy:
    return load_policy(None).with_drivers(frozenset({GPU, NIC}))


@pytest.fixture
async def apiserver(policy: Policy) -> AsyncIterator[APIServer]:
    server = APIServer(served_kinds(policy), token=NODE_TOKEN)
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def gatekeeper(apiserver: APIServer, policy: Policy, pki: PKI) -> AsyncIterator[Running]:
    async with running_gatekeeper(apiserver, policy, pki) as running:
        yield running


@pytest.fixture
def kubectl(gatekeeper: Running, tmp_path: Path) -> Kubectl:
    return Kubectl(write_kubeconfig(tmp_path, gatekeeper, GPU), tmp_path / "cache")
