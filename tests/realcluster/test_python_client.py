"""The official ``kubernetes`` Python client as a driver, over the gatekeeper's mTLS listener:
a claim status read-modify-write of the driver's own ``status.devices`` entry, and the same
write refused when it touches another driver's entry. What counts is what the apiserver stored.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client import ApiException, V1AllocatedDeviceStatus

from tests.realcluster.cluster import Api, RealCluster
from tests.realcluster.objects import CLAIMS, allocate_claim, create_claim
from tests.realcluster.processes import GatekeeperProcess

GPU, NIC = "gpu.example.com", "nic.example.com"
NAMESPACE, NAME = "tenant", "python-client"
PATH = f"{CLAIMS.format(ns=NAMESPACE)}/{NAME}"


@pytest.fixture
def resource_api(
    real_gatekeeper: GatekeeperProcess, tmp_path: Path
) -> Iterator[client.ResourceV1Api]:
    """``ResourceV1Api`` of the GPU driver, configured from its kubeconfig (mTLS)."""
    kubeconfig = real_gatekeeper.driver_kubeconfig(GPU, tmp_path)
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    with api_client:
        yield client.ResourceV1Api(api_client)


@pytest.fixture
def claim(real_cluster: RealCluster) -> dict[str, Any]:
    """A claim the admin allocated on node-a to both drivers, with the NIC driver's status
    entry already written."""
    admin = real_cluster.admin
    allocated = allocate_claim(
        admin,
        create_claim(admin, NAMESPACE, NAME),
        [(GPU, "node-a", "gpu-0"), (NIC, "node-a", "nic-0")],
    )
    allocated["status"]["devices"] = [
        {"driver": NIC, "pool": "node-a", "device": "nic-0", "data": {"link": "up"}}
    ]
    return dict(admin.call("PUT", f"{PATH}/status", allocated))


def _entries(admin: Api) -> dict[str, dict[str, Any]]:
    stored = admin.get(PATH)
    return {e["driver"]: e for e in stored["status"]["devices"]}


def test_status_read_modify_write(
    resource_api: client.ResourceV1Api,
    claim: dict[str, Any],
    real_cluster: RealCluster,
    journal: None,
    clean: None,
) -> None:
    read = resource_api.read_namespaced_resource_claim_status(NAME, NAMESPACE)
    assert read.metadata.resource_version == claim["metadata"]["resourceVersion"]
    read.status.devices.append(
        V1AllocatedDeviceStatus(driver=GPU, pool="node-a", device="gpu-0", data={"prepared": 1})
    )
    written = resource_api.replace_namespaced_resource_claim_status(NAME, NAMESPACE, read)
    assert [d.driver for d in written.status.devices] == [NIC, GPU]

    # Modify the entry just written, from a fresh read.
    again = resource_api.read_namespaced_resource_claim_status(NAME, NAMESPACE)
    own = next(d for d in again.status.devices if d.driver == GPU)
    own.data = {"prepared": 2}
    resource_api.replace_namespaced_resource_claim_status(NAME, NAMESPACE, again)

    stored = _entries(real_cluster.admin)
    assert stored[GPU]["data"] == {"prepared": 2}
    assert stored[NIC] == claim["status"]["devices"][0]


def test_another_drivers_entry_is_refused(
    resource_api: client.ResourceV1Api,
    claim: dict[str, Any],
    real_cluster: RealCluster,
    journal: None,
    clean: None,
) -> None:
    read = resource_api.read_namespaced_resource_claim_status(NAME, NAMESPACE)
    other = next(d for d in read.status.devices if d.driver == NIC)
    other.data = {"link": "down"}
    with pytest.raises(ApiException) as refused:
        resource_api.replace_namespaced_resource_claim_status(NAME, NAMESPACE, read)
    assert refused.value.status == 403
    status = json.loads(refused.value.body)
    assert status["reason"] == "Forbidden"
    assert status["message"] == (
        f'resourceclaims.resource.k8s.io "{NAME}" is forbidden: User "{GPU}" cannot update '
        'resource "resourceclaims/status" in API group "resource.k8s.io" in the namespace '
        f'"{NAMESPACE}": status.devices[0].data.link differs from the stored object (driver '
        f'"{NIC}"): a driver may change only its own status.devices entries'
    )
    assert refused.value.headers["Audit-Id"]

    stored = real_cluster.admin.get(PATH)
    assert stored["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]
    assert _entries(real_cluster.admin)[NIC]["data"] == {"link": "up"}


def test_discovery(resource_api: client.ResourceV1Api, journal: None) -> None:
    """The client's discovery calls end in "/" (/api/, /apis/<group>/<version>/, /version/);
    the gatekeeper passes them as the apiserver serves them."""
    api_client = resource_api.api_client
    assert client.VersionApi(api_client).get_code().git_version
    assert client.CoreApi(api_client).get_api_versions().versions == ["v1"]
    assert "nodes" in {r.name for r in client.CoreV1Api(api_client).get_api_resources().resources}
    groups = {g.name for g in client.ApisApi(api_client).get_api_versions().groups}
    assert {"resource.k8s.io", "devmgmtproto.k8s.io"} <= groups
    assert client.ResourceApi(api_client).get_api_group().name == "resource.k8s.io"
    resources = {r.name for r in resource_api.get_api_resources().resources}
    assert {"resourceslices", "resourceclaims", "resourceclaims/status"} <= resources
