"""The real tier: a kube-apiserver 1.36 and etcd 3.6 built from the Go module beside this file,
``dra-gatekeeper serve`` in front, and drivers built on client-go and the upstream DRA library.

Every test here is marked ``realcluster`` (``pytest -m realcluster`` runs the tier alone,
``-m 'not realcluster'`` leaves it out). Without Go the tier is skipped with one line saying so;
under CI (``CI`` set) it must run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import gatekeeper
from tests.realcluster.admission import forwarded_but_denied, install_admission
from tests.realcluster.build import Binaries, GoMissing, build
from tests.realcluster.cluster import RealCluster
from tests.realcluster.objects import GATEKEEPER_NS, GATEKEEPER_SA, bootstrap, bound_token
from tests.realcluster.processes import (
    DriverProcess,
    GatekeeperProcess,
    assert_refusals_never_reached,
)

DRIVERS = ("gpu.example.com", "nic.example.com")
DEFAULT_POLICY = Path(gatekeeper.__file__).parent / "policies" / "default.yaml"
SERVICE_ACCOUNTS = {
    "gpu.example.com": "gpu-system/gpu-driver",
    "nic.example.com": "nic-system/nic-driver",
}
"""The drivers' own service accounts, mapped in the tier's policy (the token listener)."""
_HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def real_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged default policy with the drivers' service accounts mapped."""
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    mapping = "".join(f"  {driver}: [{account}]\n" for driver, account in SERVICE_ACCOUNTS.items())
    path.write_text(DEFAULT_POLICY.read_text() + "\nserviceAccounts:\n" + mapping)
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.realcluster)
            # One worker runs the whole tier: its cluster is a session fixture, built once.
            item.add_marker(pytest.mark.xdist_group("realcluster"))


@pytest.fixture(scope="session")
def binaries() -> Binaries:
    try:
        return build()
    except GoMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}; under CI the real tier must run")
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def real_cluster(binaries: Binaries, real_policy: Path) -> Iterator[RealCluster]:
    cluster = RealCluster.start(binaries)
    try:
        bootstrap(cluster, real_policy, DRIVERS)
        # The whole tier runs under the exported admission policy (docs/admission-policy.md).
        install_admission(cluster, real_policy, DRIVERS)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def real_gatekeeper(real_cluster: RealCluster, real_policy: Path) -> Iterator[GatekeeperProcess]:
    """The gatekeeper of node-a, with its service account's token bound to its pod there (as
    the DaemonSet's projected token is), the default policy with both drivers and their
    service accounts, and all three listeners (sockets, mTLS, tokens).

    When the session ends: the admission policy refused nothing it forwarded."""
    token, _ = bound_token(real_cluster, GATEKEEPER_NS, GATEKEEPER_SA, "node-a")
    token_file = real_cluster.workdir / "gatekeeper.token"
    token_file.write_text(token)
    process = GatekeeperProcess(
        real_cluster, real_policy, DRIVERS, token_file, listen_token=True
    ).start()
    try:
        yield process
        process.settle()
        forwarded = {
            e["annotations"]["dra-gatekeeper.io/upstream-audit-id"]
            for e in process.audit_events()
            if "dra-gatekeeper.io/upstream-audit-id" in e["annotations"]
        }
        assert forwarded_but_denied(real_cluster.audit_events(), forwarded) == []
    finally:
        process.stop()


@pytest.fixture
def journal(real_cluster: RealCluster, real_gatekeeper: GatekeeperProcess) -> Iterator[None]:
    """After the test: nothing the gatekeeper refused reached the apiserver (its own audit log)."""
    mark = real_gatekeeper.audit_mark()
    yield
    assert_refusals_never_reached(real_cluster, real_gatekeeper, mark)


@pytest.fixture
def clean(real_cluster: RealCluster) -> Iterator[None]:
    """Remove every ResourceSlice, DevicePool and test claim after the test (as an admin)."""
    yield
    admin = real_cluster.admin
    admin.delete("/apis/resource.k8s.io/v1/resourceslices")
    admin.delete("/apis/devmgmtproto.k8s.io/v1alpha1/devicepools")
    for namespace in ("default", "tenant"):
        admin.delete(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")


@pytest.fixture
def gpu_driver(
    binaries: Binaries, real_gatekeeper: GatekeeperProcess, tmp_path: Path
) -> Iterator[DriverProcess]:
    """The Go driver on client-go as gpu.example.com, through the gatekeeper's Unix socket: its
    typed writes send protobuf."""
    connect = f"kubeconfig={real_gatekeeper.driver_kubeconfig('gpu.example.com', tmp_path)}"
    with DriverProcess(binaries["dradriver"], connect, driver="gpu.example.com") as driver:
        yield driver
