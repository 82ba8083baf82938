"""Shared fixtures: throwaway PKI, the embedded API server as upstream, a running gatekeeper.

The helpers behind them ship in :mod:`gatekeeper.testing`; test modules import from there.
Tests marked ``kubectl`` are skipped when kubectl is not installed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from gatekeeper.policy import Policy, load_policy
from gatekeeper.testing import APIServer, served_kinds
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
# pytest --hypothesis-profile=long) runs far more examples (README, "Property tests").
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
        skip = pytest.mark.skip(reason="kubectl is not installed")
        for item in items:
            if "kubectl" in item.keywords:
                item.add_marker(skip)


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
