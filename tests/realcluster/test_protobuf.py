"""Protobuf bodies from client-go's typed clients (their default), through the gatekeeper to a
real apiserver: refusals never reach it, garbage gets its own 400, and an update without
resourceVersion is pinned to the version that was checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.realcluster.build import Binaries
from tests.realcluster.cluster import RealCluster
from tests.realcluster.interposer import Interposer
from tests.realcluster.objects import CLAIMS, allocate_claim, create_claim
from tests.realcluster.processes import DriverProcess, GatekeeperProcess

GPU, NIC = "gpu.example.com", "nic.example.com"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PROTOBUF = "application/vnd.kubernetes.protobuf"
GATEKEEPER_USER = "system:serviceaccount:dra-gatekeeper:dra-gatekeeper"


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


ADMISSION_REFUSAL = (
    "ValidatingAdmissionPolicy 'dra-gatekeeper' with binding 'dra-gatekeeper' denied request: "
    "resourceslices.resource.k8s.io: the object must name one of the node's drivers, this node, "
    "and a pool prefixed by the node name"
)


def real_writes(cluster: RealCluster, name: str) -> list[dict[str, Any]]:
    """The apiserver's audit events of writes to ``name`` that were not dry runs."""
    return [
        e
        for e in cluster.audit_events()
        if name in (e.get("objectRef", {}).get("name"), _name(e.get("requestObject")))
        and e["verb"] in ("create", "update", "patch", "delete")
        and "dryRun=All" not in e["requestURI"]
    ]


def _name(obj: Any) -> Any:
    return obj.get("metadata", {}).get("name") if isinstance(obj, dict) else None


@pytest.mark.parametrize(
    ("name", "driver", "node", "pool", "message"),
    [
        ("pb-other-driver", NIC, "node-a", "node-a", 'spec.driver "nic.example.com"'),
        # The gatekeeper decides a protobuf create on the apiserver's dry-run preview, made with
        # its own credentials: the exported admission policy refuses that preview first, and
        # its refusal is the answer (docs/admission-policy.md, proven on the real tier).
        ("pb-other-node", GPU, "node-b", "node-b", ADMISSION_REFUSAL),
        ("pb-other-pool", GPU, "node-a", "node-b/x", ADMISSION_REFUSAL),
        ("pb-dash-pool", GPU, "node-a", "node-a-b", ADMISSION_REFUSAL),
    ],
)
def test_refused_protobuf_creates_never_land(
    real_cluster: RealCluster,
    gpu_driver: DriverProcess,
    name: str,
    driver: str,
    node: str,
    pool: str,
    message: str,
    journal: None,
    clean: None,
) -> None:
    answer = gpu_driver("create-slice", object=slice_object(name, driver, node, pool))
    assert (answer["ok"], answer.get("code")) == (False, 403), answer
    assert message in answer["message"]
    assert not real_cluster.admin.exists(f"{SLICES}/{name}")
    assert real_writes(real_cluster, name) == []


def test_protobuf_create_lands_and_is_audited_as_decoded(
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    gpu_driver: DriverProcess,
    journal: None,
    clean: None,
) -> None:
    mark = real_gatekeeper.audit_mark()
    answer = gpu_driver("create-slice", object=slice_object("pb-mine"))
    assert answer["ok"], answer
    assert real_cluster.admin.get(f"{SLICES}/pb-mine")["spec"]["driver"] == GPU
    real_gatekeeper.settle()
    (event,) = [e for e in real_gatekeeper.audit_events()[mark:] if e["verb"] == "create"]
    assert event["annotations"]["dra-gatekeeper.io/content-type"] == PROTOBUF
    assert event["requestObject"]["spec"]["pool"]["name"] == "node-a"
    (write,) = real_writes(real_cluster, "pb-mine")
    assert write["auditID"] == event["auditID"]  # the driver's request, forwarded as sent


def test_protobuf_update_of_a_hidden_claim_asks_nothing(
    real_cluster: RealCluster, gpu_driver: DriverProcess, journal: None, clean: None
) -> None:
    admin = real_cluster.admin
    allocate_claim(admin, create_claim(admin, "default", "nics"), [(NIC, "node-a", "eth0")])
    answer = gpu_driver(
        "update-status",
        namespace="default",
        name="nics",
        devices=[{"driver": GPU, "pool": "node-a", "device": "gpu-0"}],
    )
    # The typed client's read is already 404: the claim does not exist for this driver.
    assert (answer["ok"], answer.get("code")) == (False, 404), answer
    asked = [
        e["requestURI"]
        for e in real_cluster.audit_events()
        if e["user"]["username"] == GATEKEEPER_USER and "/nics" in e["requestURI"]
    ]
    assert asked == ["/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/nics"]  # a GET


@pytest.mark.parametrize(
    ("raw", "message"),
    [  # the bodies of recordings 222 and 223, and the apiserver's words for them
        (b"\n\x03foo\x12\xffgarbage-not-protobuf\x00\x01", "does not appear to be a protobuf"),
        (b"k8s\x00\n\xff\xff\xffgarbage", "unexpected EOF"),
    ],
)
def test_garbage_protobuf_gets_the_apiservers_400(
    real_gatekeeper: GatekeeperProcess, raw: bytes, message: str, journal: None
) -> None:
    api = real_gatekeeper.driver_api(GPU)
    mark = real_gatekeeper.audit_mark()
    with pytest.raises(Exception) as refused:
        api.call("POST", SLICES, raw=raw, content_type=PROTOBUF)
    error: Any = refused.value
    assert error.code == 400, error
    assert error.body["message"].startswith(
        "the object provided is unrecognized (must be of type ResourceSlice)"
    )
    assert message in error.body["message"]
    real_gatekeeper.settle()
    (event,) = [e for e in real_gatekeeper.audit_events()[mark:] if e["verb"] == "create"]
    assert event["annotations"]["authorization.k8s.io/reason"] == (
        "the apiserver rejected the create preview"
    )


@pytest.mark.parametrize("target", ["slice", "claim-status"])
def test_protobuf_update_without_resource_version_is_pinned(
    binaries: Binaries,
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    target: str,
    tmp_path: Path,
    clean: None,
) -> None:
    """Someone else writes between the gatekeeper's check (its dry run) and its write: the
    driver's unconditional protobuf update (recording 210) must fail with 409, not clobber."""
    admin = real_cluster.admin
    if target == "slice":
        path = f"{SLICES}/raced"
        admin.create(SLICES, slice_object("raced"))
        op: dict[str, Any] = {"op": "update-slice", "object": slice_object("raced")}
        op["object"]["metadata"]["labels"] = {"by": "driver"}
    else:
        claim = create_claim(admin, "default", "raced")
        allocate_claim(admin, claim, [(GPU, "node-a", "gpu-0")])
        path = f"{CLAIMS.format(ns='default')}/raced"
        devices = [{"driver": GPU, "pool": "node-a", "device": "gpu-0", "data": {"by": "driver"}}]
        op = {"op": "update-status", "namespace": "default", "name": "raced"}
        op |= {"devices": devices, "unconditional": True}

    def someone_else_writes() -> None:
        current = admin.get(path)
        current["metadata"].setdefault("annotations", {})["written-by"] = "someone-else"
        admin.call("PUT", path, current)

    def is_the_dry_run(method: str, path_qs: str) -> bool:
        return method == "PUT" and "dryRun=All" in path_qs and "/raced" in path_qs

    with Interposer(real_cluster, is_the_dry_run, someone_else_writes) as interposer:
        gatekeeper = GatekeeperProcess(
            real_cluster,
            real_gatekeeper.policy,
            real_gatekeeper.drivers,
            real_gatekeeper.token_file,
            extra_args=("--upstream", interposer.url),
        ).start()
        try:
            connect = f"kubeconfig={gatekeeper.driver_kubeconfig(GPU, tmp_path)}"
            with DriverProcess(binaries["dradriver"], connect, driver=GPU) as driver:
                name = op.pop("op")
                answer = driver(name, **op)
        finally:
            gatekeeper.stop()
    assert interposer.fired.is_set()
    assert (answer["ok"], answer.get("code")) == (False, 409), answer
    stored = admin.get(path)
    assert stored["metadata"]["annotations"]["written-by"] == "someone-else"
    assert "by" not in stored["metadata"].get("labels", {})
    assert "data" not in (stored.get("status", {}).get("devices") or [{}])[0]
