"""Claim status as dra-example-driver writes it, through the gatekeeper, with client-go's
defaults (typed UpdateStatus sends protobuf; ApplyStatus sends an apply patch), and the DRA
helper's NodePrepareResources reading claims through draclient."""

from __future__ import annotations

from typing import Any

import pytest

from tests.realcluster.cluster import RealCluster
from tests.realcluster.objects import CLAIMS, allocate_claim, create_claim
from tests.realcluster.processes import DriverProcess, GatekeeperProcess

GPU, NIC = "gpu.example.com", "nic.example.com"
PROTOBUF = "application/vnd.kubernetes.protobuf"


@pytest.fixture
def claim(real_cluster: RealCluster, clean: None) -> dict[str, Any]:
    """A claim the admin allocated (as the scheduler would) to GPU and NIC devices on node-a."""
    created = create_claim(real_cluster.admin, "default", "shared")
    return allocate_claim(
        real_cluster.admin,
        created,
        [(GPU, "node-a", "gpu-0"), (NIC, "node-a", "eth0")],
    )


def stored_devices(cluster: RealCluster, name: str = "shared") -> list[dict[str, Any]]:
    claim = cluster.admin.get(f"{CLAIMS.format(ns='default')}/{name}")
    return list(claim.get("status", {}).get("devices") or [])


def ready(driver: str, pool: str, device: str) -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": pool,
        "device": device,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": "",
                "lastTransitionTime": "2026-12-03T10:00:00Z",
            }
        ],
        "data": {"vlan": 7},
    }


def test_update_status_with_protobuf_writes_own_entry(
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    gpu_driver: DriverProcess,
    claim: dict[str, Any],
    journal: None,
) -> None:
    mark = real_gatekeeper.audit_mark()
    answer = gpu_driver(
        "update-status", namespace="default", name="shared", devices=[ready(GPU, "node-a", "gpu-0")]
    )
    assert answer["ok"], answer
    (entry,) = stored_devices(real_cluster)
    assert (entry["driver"], entry["device"], entry["data"]) == (GPU, "gpu-0", {"vlan": 7})
    # client-go's default: a protobuf body, decided on the apiserver's decoding of it.
    real_gatekeeper.settle()
    (event,) = [e for e in real_gatekeeper.audit_events()[mark:] if e["verb"] == "update"]
    assert event["annotations"]["dra-gatekeeper.io/content-type"] == PROTOBUF
    assert event["annotations"]["dra-gatekeeper.io/decoded-by"]
    assert event["requestObject"]["status"]["devices"][0]["data"] == {"vlan": 7}


def test_apply_status_writes_own_entry(
    real_cluster: RealCluster, gpu_driver: DriverProcess, claim: dict[str, Any], journal: None
) -> None:
    apply = {
        "driver": GPU,
        "pool": "node-a",
        "device": "gpu-0",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Applied",
                "message": "",
                "lastTransitionTime": "2026-12-03T10:00:00Z",
            }
        ],
    }
    answer = gpu_driver("apply-status", namespace="default", name="shared", apply=[apply])
    assert answer["ok"], answer
    (entry,) = stored_devices(real_cluster)
    assert entry["conditions"][0]["reason"] == "Applied"


def test_update_status_of_another_drivers_entry_is_refused(
    real_cluster: RealCluster, gpu_driver: DriverProcess, claim: dict[str, Any], journal: None
) -> None:
    # The NIC driver's entry first (as an admin), then GPU rewrites it in a protobuf body.
    body = real_cluster.admin.get(f"{CLAIMS.format(ns='default')}/shared")
    body["status"]["devices"] = [ready(NIC, "node-a", "eth0")]
    real_cluster.admin.call("PUT", f"{CLAIMS.format(ns='default')}/shared/status", body)
    changed = ready(NIC, "node-a", "eth0") | {"data": {"vlan": 666}}
    answer = gpu_driver(
        "update-status", namespace="default", name="shared", devices=[changed], allDevices=True
    )
    assert (answer["ok"], answer.get("code")) == (False, 403), answer
    assert "status.devices" in answer["message"]
    assert stored_devices(real_cluster)[0]["data"] == {"vlan": 7}


def test_prepare_reads_claims_through_draclient(
    real_cluster: RealCluster, gpu_driver: DriverProcess, claim: dict[str, Any], journal: None
) -> None:
    uid = claim["metadata"]["uid"]
    answer = gpu_driver("prepare", claims=[{"namespace": "default", "name": "shared", "uid": uid}])
    assert answer["ok"], answer
    assert answer["claims"][uid] == {"error": "", "devices": ["node-a/gpu-0"]}


def test_prepare_of_a_claim_allocated_to_another_driver_fails_and_the_driver_recovers(
    real_cluster: RealCluster, gpu_driver: DriverProcess, claim: dict[str, Any], journal: None
) -> None:
    other = allocate_claim(
        real_cluster.admin,
        create_claim(real_cluster.admin, "default", "nic-only"),
        [(NIC, "node-a", "eth1")],
    )
    hidden = gpu_driver(
        "prepare",
        claims=[{"namespace": "default", "name": "nic-only", "uid": other["metadata"]["uid"]}],
    )
    # draclient takes the 404 for "version not served" and tries the next versions: all 404.
    assert not hidden["ok"] and "not found" in hidden["error"], hidden
    uid = claim["metadata"]["uid"]
    again = gpu_driver("prepare", claims=[{"namespace": "default", "name": "shared", "uid": uid}])
    assert again["ok"] and again["claims"][uid]["devices"] == ["node-a/gpu-0"], again
