"""The reference driver behind the gatekeeper: dra-example-driver's kubelet plugin v0.3.0, built
from the Go module proxy and run unchanged, as its Helm chart runs it (its ServiceAccount, its
env, ``rest.InClusterConfig()`` from its pod's service-account volume, here pointed at the
gatekeeper's token listener), decided by ``policies/dra-example-driver.yaml`` under a gatekeeper
deployed as ``policy deploy`` says; the kubelet's side calls its gRPC API as when a pod with a
claim starts and stops.

The gatekeeper's audit log is read after each test: any refusal of the driver's own requests
fails it, and so does a call not in :data:`CALLS`, so that a new version of the driver making a
new call is caught here."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster.build import Binaries
from tests.realcluster.cluster import ApiError, RealCluster, poll
from tests.realcluster.exampledriver import (
    DRIVER,
    DRIVER_USER,
    NAMESPACE,
    Kubelet,
    Plugin,
    Refused,
    account_of,
    calls_of,
    deploy_gatekeeper,
    launch,
    plugin_events,
    refusals,
    slices_of,
)
from tests.realcluster.objects import (
    CLAIMS,
    GATEKEEPER_NS,
    allocate_claim,
    create_claim,
    ensure,
)
from tests.realcluster.processes import (
    GatekeeperProcess,
    assert_refusals_never_reached,
)

POLICY = Path(__file__).resolve().parents[2] / "policies" / "dra-example-driver.yaml"
GATEKEEPER_ACCOUNT = "example-gatekeeper"
NAME = "dra-gatekeeper-example"
LABEL = "test-example-driver"
"""On the claims the tests make (deleted when the module ends)."""
CALLS = {
    # The DRA helper's ResourceSlice controller (k8s.io/dynamic-resource-allocation/resourceslice):
    # its informer, the Node for the slices' owner reference, then one write per slice.
    ("watch", "resourceslices", "resource.k8s.io/v1", ""),
    ("list", "resourceslices", "resource.k8s.io/v1", ""),
    ("get", "nodes", "v1", ""),
    ("create", "resourceslices", "resource.k8s.io/v1", "application/vnd.kubernetes.protobuf"),
    ("update", "resourceslices", "resource.k8s.io/v1", "application/vnd.kubernetes.protobuf"),
    ("delete", "resourceslices", "resource.k8s.io/v1", ""),
    # The helper's NodePrepareResources (draclient): each claim read by name; after a 404 it
    # tries the older versions in turn (a claim it may not read is answered 404).
    ("get", "resourceclaims", "resource.k8s.io/v1", ""),
    ("get", "resourceclaims", "resource.k8s.io/v1beta2", ""),
    ("get", "resourceclaims", "resource.k8s.io/v1beta1", ""),
}
"""Every call the reference driver may make (verb, resource, version, body encoding)."""


@dataclass(frozen=True)
class Setup:
    binaries: Binaries
    cluster: RealCluster
    gatekeeper: GatekeeperProcess
    workdir: Path


@pytest.fixture(scope="module")
def setup(
    binaries: Binaries, real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    """The chart's namespace, and node-a's gatekeeper deployed for the driver's policy."""
    workdir = tmp_path_factory.mktemp("example-driver")
    ensure(
        real_cluster.admin,
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    )
    gatekeeper = deploy_gatekeeper(
        real_cluster, POLICY, (GATEKEEPER_NS, GATEKEEPER_ACCOUNT), NAME, workdir
    )
    try:
        yield Setup(binaries, real_cluster, gatekeeper, workdir)
    finally:
        gatekeeper.stop()
        admin = real_cluster.admin
        admin.delete(
            f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D{DRIVER}"
        )
        admin.delete(f"{CLAIMS.format(ns='tenant')}?labelSelector={LABEL}%3Dtrue")


def start_plugin(setup: Setup, node: str, **env: str) -> Plugin:
    """The plugin in its pod on ``node``, reaching node-a's gatekeeper."""
    server = (setup.gatekeeper.token_port, setup.gatekeeper.pki.path("ca.crt"))
    binary = setup.binaries["dra-example-kubeletplugin"]
    return launch(binary, setup.cluster, node, server, setup.workdir, **env)


@dataclass
class Run:
    """A plugin on node-a and its kubelet, and what the gatekeeper logged before it started."""

    plugin: Plugin
    kubelet: Kubelet
    mark: int
    provoked: list[str] = field(default_factory=list)
    """Claims a test asked the plugin to prepare on purpose that are not the driver's (the ends
    of their paths, ``/namespaces/<ns>/resourceclaims/<name>``): its reads of them, in every
    version, are refused as absent, and expected so."""


@pytest.fixture
def honest(setup: Setup, request: pytest.FixtureRequest) -> Iterator[Run]:
    """The plugin on node-a (``request.param``: environment beside the chart's); when the test
    ends, the gatekeeper refused none of its requests but those the test provoked, and a 404 of
    something absent; it made no call not in :data:`CALLS`; and the apiserver saw none of what
    was refused."""
    mark = setup.gatekeeper.audit_mark()
    env = getattr(request, "param", {})
    with start_plugin(setup, "node-a", **env) as plugin:
        run = Run(plugin, Kubelet(setup.binaries["kubeletdra"], plugin), mark)
        yield run
    events = plugin_events(setup.gatekeeper, mark)
    assert events, "the driver made no request through the gatekeeper"
    assert {account_of(event) for event in events} == {DRIVER_USER}
    refused = [r for r in refusals(events) if r.rule != "not-found"]
    assert [r for r in refused if not r.path.endswith(tuple(run.provoked))] == []
    assert all((r.code, r.rule) == (404, "not-in-scope") for r in refused), refused
    assert set(calls_of(events)) <= CALLS
    assert_refusals_never_reached(setup.cluster, setup.gatekeeper, mark)


def published(setup: Setup, count: int) -> list[dict[str, Any]]:
    """The driver's slices of node-a once ``count`` devices are published in them."""

    def devices() -> list[dict[str, Any]] | None:
        items = slices_of(setup.cluster, "node-a")
        found = sum(len(s["spec"].get("devices", [])) for s in items)
        return items if found == count else None

    return poll(f"{count} devices published", devices, timeout=60)


def test_its_slices_appear_with_its_devices(setup: Setup, honest: Run) -> None:
    (stored,) = published(setup, 8)
    spec = stored["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, "node-a", "node-a")
    assert sorted(d["name"] for d in spec["devices"]) == [f"gpu-{i}" for i in range(8)]
    device = next(d for d in spec["devices"] if d["name"] == "gpu-0")
    assert device["attributes"]["model"] == {"string": "LATEST-GPU-MODEL"}
    assert device["capacity"]["memory"] == {"value": "80Gi"}
    # The owner is its Node, which the helper read through the gatekeeper.
    (owner,) = stored["metadata"]["ownerReferences"]
    node = setup.cluster.admin.get("/api/v1/nodes/node-a")
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Node",
        "node-a",
        node["metadata"]["uid"],
    )
    assert honest.kubelet.call("health") == {"status": "SERVING"}


def claim(setup: Setup, name: str, driver: str, node: str = "node-a") -> dict[str, Any]:
    """A claim in namespace tenant allocated to ``driver``'s gpu-0 on ``node``, as the scheduler
    writes it."""
    admin = setup.cluster.admin
    path = CLAIMS.format(ns="tenant")
    try:
        admin.delete(f"{path}/{name}")
    except ApiError as error:
        assert error.code == 404
    created = create_claim(admin, "tenant", name, labels={LABEL: "true"})
    return allocate_claim(admin, created, [(driver, node, "gpu-0")], node=node)


def test_a_claim_of_the_driver_is_prepared_and_unprepared(setup: Setup, honest: Run) -> None:
    published(setup, 8)
    mine = claim(setup, "example-mine", DRIVER)
    uid = mine["metadata"]["uid"]
    answer = honest.kubelet.prepare(mine)
    (device,) = answer["claims"][uid]["devices"]
    assert answer["claims"][uid]["error"] == ""
    assert (device["pool"], device["device"], device["requestNames"]) == (
        "node-a",
        "gpu-0",
        ["gpu"],
    )
    specs = honest.plugin.cdi_specs()
    (spec_file,) = [name for name in specs if uid in name]
    (cdi_device,) = specs[spec_file]["devices"]
    assert cdi_device["name"] == f"{uid}-gpu-0"
    assert f"GPU_DEVICE_GPU_0_RESOURCE_CLAIM={uid}" in cdi_device["containerEdits"]["env"]
    assert device["cdiDeviceIDs"] == [
        "k8s.gpu.example.com/gpu=common",
        f"k8s.gpu.example.com/gpu={uid}-gpu-0",
    ]
    assert honest.kubelet.unprepare(mine) == {
        "registration": answer["registration"],
        "claims": {uid: {"error": ""}},
    }
    assert not [name for name in honest.plugin.cdi_specs() if uid in name]


@pytest.mark.parametrize(
    ("driver", "node"), [("nic.example.com", "node-a"), (DRIVER, "node-b")], ids=["driver", "node"]
)
def test_a_claim_not_the_drivers_here_is_not_prepared(
    setup: Setup, honest: Run, driver: str, node: str
) -> None:
    """The kubelet would not ask (it calls the plugins of a claim's own drivers, on its own
    node); whoever can reach the plugin's socket could. The plugin cannot even read the claim."""
    other = claim(setup, f"example-other-{node}", driver, node)
    honest.provoked.append(f"/namespaces/tenant/resourceclaims/{other['metadata']['name']}")
    answer = honest.kubelet.prepare(other)
    name = other["metadata"]["name"]
    assert f'resourceclaims.resource.k8s.io "{name}" not found' in answer["error"], answer
    assert honest.plugin.cdi_specs().keys() == {"k8s.gpu.example.com-gpu_common.yaml"}


@pytest.mark.parametrize("honest", [{"GPU_PARTITIONS": "2"}], indirect=True, ids=["partitions"])
def test_partitioned_gpus_publish_shared_counters(setup: Setup, honest: Run) -> None:
    """GPU_PARTITIONS (DRAPartitionableDevices, beta in 1.36): two slices in the node's pool,
    one with the counter sets and one with the devices consuming them."""
    stored = published(setup, 8 * 3)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in stored} == {2}
    (counters,) = [s["spec"] for s in stored if "sharedCounters" in s["spec"]]
    assert "devices" not in counters
    assert [c["name"] for c in counters["sharedCounters"]] == [
        f"gpu-{i}-counters" for i in range(8)
    ]
    assert counters["sharedCounters"][0]["counters"] == {
        "compute": {"value": "100"},
        "memory": {"value": "80Gi"},
    }
    (devices,) = [s["spec"]["devices"] for s in stored if "devices" in s["spec"]]
    partition = next(d for d in devices if d["name"] == "gpu-3-partition-1")
    assert partition["consumesCounters"][0]["counterSet"] == "gpu-3-counters"
    assert partition["consumesCounters"][0]["counters"]["memory"] == {"value": "40Gi"}
    # Back to whole GPUs: the plugin rewrites its pool in one slice and deletes the other.
    honest.plugin.stop()
    with start_plugin(setup, "node-a"):
        (whole,) = published(setup, 8)
        assert whole["spec"]["pool"]["resourceSliceCount"] == 1
        assert "sharedCounters" not in whole["spec"]
    verbs = [event["verb"] for event in plugin_events(setup.gatekeeper, honest.mark)]
    assert verbs.count("delete") == 1, verbs


def test_a_token_of_another_nodes_pod_stores_nothing(setup: Setup) -> None:
    """The same binary, its pod on node-b, pointed at node-a's gatekeeper: every request is
    refused for its token, nothing reaches the apiserver, and nothing is stored or prepared."""
    mark = setup.gatekeeper.audit_mark()
    elsewhere = claim(setup, "example-node-b", DRIVER, "node-b")
    with start_plugin(setup, "node-b") as plugin:
        kubelet = Kubelet(setup.binaries["kubeletdra"], plugin)

        def refused_publishing() -> list[Refused] | None:
            found = refusals(plugin_events(setup.gatekeeper, mark))
            return found if any(r.path.endswith("/resourceslices") for r in found) else None

        poll("the helper's slice informer to be refused", refused_publishing, timeout=60)
        answer = kubelet.prepare(elsewhere)
        assert 'the token is bound to a pod on node "node-b"' in answer["error"], answer
        assert plugin.cdi_specs().keys() == {"k8s.gpu.example.com-gpu_common.yaml"}
    events = plugin_events(setup.gatekeeper, mark)
    refused = refusals(events)
    assert len(refused) == len(events) > 0
    assert {(r.code, r.rule) for r in refused} == {(403, "node-mismatch")}, refused
    assert {r.reason for r in refused} == {f"token of {DRIVER_USER} is bound to node node-b"}
    assert slices_of(setup.cluster, "node-b") == []
    assert_refusals_never_reached(setup.cluster, setup.gatekeeper, mark)
