"""Informers as drivers run them (client-go's defaults: WatchList, protobuf) on the driver's own
slices and on claims, and deletes with DeleteOptions, through the gatekeeper."""

from __future__ import annotations

from typing import Any

from tests.realcluster.cluster import RealCluster, poll
from tests.realcluster.objects import allocate_claim, create_claim
from tests.realcluster.processes import DriverProcess, GatekeeperProcess

GPU, NIC = "gpu.example.com", "nic.example.com"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def slice_object(
    name: str, driver: str = GPU, node: str = "node-a", pool: str = "node-a"
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "dev-0"}],
        },
    }


def informer_names(driver: DriverProcess, kind: str) -> set[str]:
    """What the driver's informer holds now: names added and not deleted since."""
    names: set[str] = set()
    for event in driver.events_of("informer"):
        if event["kind"] != kind:
            continue
        if event["type"] == "delete":
            names.discard(event["name"])
        else:
            names.add(event["name"])
    return names


def test_informers_see_only_the_drivers_own_objects(
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    gpu_driver: DriverProcess,
    journal: None,
    clean: None,
) -> None:
    admin = real_cluster.admin
    admin.create(SLICES, slice_object("gpu-a"))
    admin.create(SLICES, slice_object("nic-a", driver=NIC))
    admin.create(SLICES, slice_object("gpu-b", node="node-b", pool="node-b"))
    allocate_claim(admin, create_claim(admin, "default", "mine"), [(GPU, "node-a", "g0")])
    allocate_claim(admin, create_claim(admin, "tenant", "theirs"), [(NIC, "node-a", "e0")])
    mark = len(real_gatekeeper.audit_events("ResponseStarted"))

    assert gpu_driver("watch", kinds=["slices", "claims"])["ok"]
    poll("both informers synced", lambda: len(gpu_driver.events_of("synced")) == 2)
    assert informer_names(gpu_driver, "slices") == {"gpu-a"}
    assert informer_names(gpu_driver, "claims") == {"mine"}
    # client-go 1.36 informers stream their initial list (WatchList) where the server can.
    watches = real_gatekeeper.audit_events("ResponseStarted")[mark:]
    assert any("sendInitialEvents=true" in e["requestURI"] for e in watches), watches

    # Changes arrive as events: a new own slice, a claim that leaves the driver's scope.
    admin.create(SLICES, slice_object("gpu-a2"))
    admin.create(SLICES, slice_object("nic-a2", driver=NIC))
    poll("the new slice seen", lambda: informer_names(gpu_driver, "slices") == {"gpu-a", "gpu-a2"})
    # Deallocated (as the scheduler does when the claim is no longer reserved).
    current = admin.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/mine")
    admin.call(
        "PUT",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/mine/status",
        {**current, "status": {}},
    )
    poll("the claim that left scope gone", lambda: informer_names(gpu_driver, "claims") == set())


def test_delete_with_options(
    real_cluster: RealCluster, gpu_driver: DriverProcess, journal: None, clean: None
) -> None:
    admin = real_cluster.admin
    stored = admin.create(SLICES, slice_object("to-delete"))
    dry = gpu_driver("delete-slice", name="to-delete", dryRun=True, propagationPolicy="Background")
    assert dry["ok"], dry
    assert admin.exists(f"{SLICES}/to-delete")

    stale = gpu_driver("delete-slice", name="to-delete", preconditionResourceVersion="1")
    assert (stale["ok"], stale.get("code")) == (False, 409), stale
    assert admin.exists(f"{SLICES}/to-delete")

    meta = stored["metadata"]
    done = gpu_driver(
        "delete-slice",
        name="to-delete",
        propagationPolicy="Background",
        gracePeriodSeconds=0,
        preconditionUID=meta["uid"],
        preconditionResourceVersion=meta["resourceVersion"],
    )
    assert done["ok"], done
    assert not admin.exists(f"{SLICES}/to-delete")


def test_delete_of_another_drivers_slice_is_refused(
    real_cluster: RealCluster, gpu_driver: DriverProcess, journal: None, clean: None
) -> None:
    real_cluster.admin.create(SLICES, slice_object("nic-owned", driver=NIC))
    answer = gpu_driver("delete-slice", name="nic-owned", propagationPolicy="Background")
    assert (answer["ok"], answer.get("code")) == (False, 403), answer
    assert "spec.driver" in answer["message"]
    assert real_cluster.admin.exists(f"{SLICES}/nic-owned")
