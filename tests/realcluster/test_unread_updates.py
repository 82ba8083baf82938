"""Updates without the second round trip, against a real kube-apiserver 1.36 (docs/security.md,
"Updates without a read").

An update of a ResourceSlice whose body carries a resourceVersion is decided on its body alone
and forwarded with no read of the stored object. What makes that safe is the apiserver itself,
so here it is the apiserver that answers: every attempt to take over another driver's or another
node's slice that way is refused with its 422 (``field is immutable``), in JSON and in protobuf
(client-go's typed ``Update``), the slice stays as it was, and the gatekeeper's audit event says
``allow`` with the apiserver's code; a stale update gets the apiserver's 409; ``audit check``
re-decides every one of these events as it was decided.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.audit.tools.check import check_records, format_report
from gatekeeper.audit.tools.reader import iter_records
from gatekeeper.codec import jsoncodec
from gatekeeper.policyfile import load_policy
from tests.realcluster.cluster import ApiError, RealCluster
from tests.realcluster.processes import DriverProcess, GatekeeperProcess

GPU, NIC = "gpu.example.com", "nic.example.com"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PROTOBUF = "application/vnd.kubernetes.protobuf"
GATEKEEPER_USER = "system:serviceaccount:dra-gatekeeper:dra-gatekeeper"
IMMUTABLE = "field is immutable"


def _spec(driver: str, node: str | None, pool: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": "dev-0"}],
    }
    if node is None:  # a node-owned slice of ReconcilePoolWithName: a selector, no node name
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
        spec["nodeSelector"] = {"nodeSelectorTerms": [term]}
    else:
        spec["nodeName"] = node
    return spec


def _slice(name: str, spec: dict[str, Any], rv: str = "") -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if rv:
        metadata["resourceVersion"] = rv
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": spec,
    }


# Slices the GPU driver on node-a must not take over: (name, driver, node, pool).
VICTIMS = [
    ("another-driver", NIC, "node-a", "node-a"),
    ("another-node", GPU, "node-b", "node-b"),
    ("another-driver-and-node", NIC, "node-b", "node-b"),
    ("another-drivers-subpool", NIC, "node-a", "node-a/nics"),
    ("a-node-selector-slice", GPU, None, "node-a"),
    ("another-drivers-node-selector-slice", NIC, None, "node-a"),
]
# What the takeover says: the caller's driver, this node by name, a pool under it.
MINE = _spec(GPU, "node-a", "node-a")


def _update(
    encoding: str, real_gatekeeper: GatekeeperProcess, driver: DriverProcess, body: dict[str, Any]
) -> tuple[int, str]:
    """The GPU driver's update of ``body``: its answer's code and message."""
    if encoding == "protobuf":
        answer = driver("update-slice", object=body)
        return (200, "") if answer["ok"] else (answer["code"], answer["message"])
    try:
        real_gatekeeper.driver_api(GPU).call("PUT", f"{SLICES}/{body['metadata']['name']}", body)
    except ApiError as error:
        return error.code, error.body["message"]
    return 200, ""


def _events(gatekeeper: GatekeeperProcess, mark: int, name: str) -> list[dict[str, Any]]:
    gatekeeper.settle()
    return [
        e
        for e in gatekeeper.audit_events()[mark:]
        if e["verb"] == "update" and e.get("objectRef", {}).get("name") == name
    ]


def _reads_by_gatekeeper(cluster: RealCluster, name: str, since: set[str]) -> list[str]:
    """The apiserver's record of GETs of slice ``name`` the gatekeeper made (its own reads:
    the driver's requests are made as the gatekeeper too, but none here is a GET)."""
    return [
        e["requestURI"]
        for e in cluster.audit_events()
        if e["auditID"] not in since
        and e["user"]["username"] == GATEKEEPER_USER
        and e["verb"] == "get"
        and e["requestURI"].split("?")[0] == f"{SLICES}/{name}"
    ]


def _writes_reached(cluster: RealCluster, name: str, since: set[str]) -> list[dict[str, Any]]:
    return [
        e
        for e in cluster.audit_events()
        if e["auditID"] not in since
        and e["verb"] == "update"
        and e["requestURI"].split("?")[0] == f"{SLICES}/{name}"
    ]


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_no_takeover_by_an_update_with_a_resource_version(
    encoding: str,
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    gpu_driver: DriverProcess,
    real_policy: Path,
    tmp_path: Path,
    journal: None,
    clean: None,
) -> None:
    admin = real_cluster.admin
    stored = {
        name: admin.create(SLICES, _slice(name, _spec(driver, node, pool)))
        for name, driver, node, pool in VICTIMS
    }
    before = real_cluster.audit_ids()
    mark = real_gatekeeper.audit_mark()
    for name, *_ in VICTIMS:
        rv = stored[name]["metadata"]["resourceVersion"]
        code, message = _update(encoding, real_gatekeeper, gpu_driver, _slice(name, MINE, rv))
        # The apiserver's own refusal: the body would change fields it keeps immutable.
        assert code == 422, (name, code, message)
        assert IMMUTABLE in message, (name, message)
        assert admin.get(f"{SLICES}/{name}") == stored[name], name  # untouched
        (event,) = _events(real_gatekeeper, mark, name)
        assert event["annotations"]["authorization.k8s.io/decision"] == "allow", event
        assert event["responseStatus"]["code"] == 422, event
        assert _reads_by_gatekeeper(real_cluster, name, before) == [], name
        # It reached the apiserver, which refused it (protobuf: as the dry run that decodes it;
        # the write itself was never sent).
        reached = _writes_reached(real_cluster, name, before)
        assert [e["responseStatus"]["code"] for e in reached] == [422], (name, reached)
        assert ("dryRun=All" in reached[0]["requestURI"]) is (encoding == "protobuf")
    _assert_rechecked(real_gatekeeper, mark, real_policy, tmp_path, len(VICTIMS))


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_own_updates_read_nothing_and_a_stale_one_gets_the_apiservers_409(
    encoding: str,
    real_cluster: RealCluster,
    real_gatekeeper: GatekeeperProcess,
    gpu_driver: DriverProcess,
    real_policy: Path,
    tmp_path: Path,
    journal: None,
    clean: None,
) -> None:
    admin = real_cluster.admin
    name = "mine"
    created = admin.create(SLICES, _slice(name, MINE))
    read_at = created["metadata"]["resourceVersion"]
    before = real_cluster.audit_ids()
    mark = real_gatekeeper.audit_mark()

    labelled = _slice(name, copy.deepcopy(MINE), read_at)
    labelled["metadata"]["labels"] = {"by": "driver"}
    assert _update(encoding, real_gatekeeper, gpu_driver, labelled) == (200, "")
    current = admin.get(f"{SLICES}/{name}")
    assert current["metadata"]["labels"] == {"by": "driver"}

    # Written at the version read before its own update: stale.
    stale = _slice(name, copy.deepcopy(MINE), read_at)
    stale["metadata"]["labels"] = {"by": "stale"}
    code, message = _update(encoding, real_gatekeeper, gpu_driver, stale)
    assert code == 409, (code, message)
    assert "the object has been modified" in message
    assert admin.get(f"{SLICES}/{name}") == current

    codes = [e["responseStatus"]["code"] for e in _events(real_gatekeeper, mark, name)]
    assert codes == [200, 409]
    assert _reads_by_gatekeeper(real_cluster, name, before) == []
    _assert_rechecked(real_gatekeeper, mark, real_policy, tmp_path, 2)


def _assert_rechecked(
    gatekeeper: GatekeeperProcess, mark: int, policy: Path, tmp_path: Path, updates: int
) -> None:
    """``audit check`` on this test's events, under the policy they were decided by: every
    update re-decided (none skipped), none changed."""
    gatekeeper.settle()
    log = tmp_path / "audit.log"
    events = [e for e in gatekeeper.audit_events()[mark:] if e["verb"] == "update"]
    assert len(events) == updates
    log.write_bytes(b"".join(jsoncodec.dumps(e) + b"\n" for e in events))
    report = check_records(iter_records([str(log)], {}), load_policy(str(policy)))
    assert sum(report.decided.values()) == updates, format_report(report)
    assert not report.skipped and not report.changes, format_report(report)
