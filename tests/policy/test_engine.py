"""The pure engine, table-driven: every rule allowed and refused, no event loop."""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.listen.identity import Identity
from gatekeeper.policy import Decision, Engine, Policy
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import decide_offline, planned_fetch

NODE = "node-a"
GPU = Identity(driver="gpu.example.com", transport="unix")
NIC = Identity(driver="nic.example.com", transport="unix")
STRANGER = Identity(driver="evil.example.com", transport="mtls")
ENGINE = Engine(load_policy(None).with_drivers(frozenset({GPU.driver, NIC.driver})), NODE)
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def slice_v1(name: str = "node-a-gpu", **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": "gpu.example.com",
            "nodeName": NODE,
            "pool": {"name": "node-a/gpus", "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    body["spec"].update(spec)
    return body


def stored(obj: dict[str, Any], rv: str = "7", uid: str = "uid-1") -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    obj["metadata"].update(resourceVersion=rv, uid=uid)
    return obj


def decide(method: str, target: str, body: Any = None, current: Any = None, who: Identity = GPU):
    return decide_offline(ENGINE, who, parse_request(method, target), body, current)


ALLOWED = [
    ("create", "POST", SLICES, slice_v1(), None),
    ("create-pool-equals-node", "POST", SLICES, slice_v1(pool={"name": "node-a"}), None),
    ("create-pool-slash", "POST", SLICES, slice_v1(pool={"name": "node-a/gpus"}), None),
    (
        "create-generate-name",
        "POST",
        SLICES,
        {**slice_v1(), "metadata": {"generateName": "node-a-gpu-"}},
        None,
    ),
    ("create-allnodes-false", "POST", SLICES, slice_v1(allNodes=False), None),
    ("get-own", "GET", f"{SLICES}/node-a-gpu", None, stored(slice_v1())),
    ("update-own", "PUT", f"{SLICES}/node-a-gpu", slice_v1(), stored(slice_v1())),
    ("delete-own", "DELETE", f"{SLICES}/node-a-gpu", None, stored(slice_v1())),
    (
        "list-pinned",
        "GET",
        f"{SLICES}?fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dgpu.example.com",
        None,
        None,
    ),
    (
        "watch-pinned-extra-terms",
        "GET",
        f"{SLICES}?watch=true&fieldSelector=spec.driver%3Dgpu.example.com,spec.nodeName%3Dnode-a,"
        "metadata.name!%3Dx",
        None,
        None,
    ),
    (
        "deletecollection-pinned",
        "DELETE",
        f"{SLICES}?fieldSelector=spec.nodeName%3Dnode-a%2Cspec.driver%3Dgpu.example.com",
        None,
        None,
    ),
    (
        "v1alpha2-create",
        "POST",
        "/apis/resource.k8s.io/v1alpha2/resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1alpha2",
            "kind": "ResourceSlice",
            "metadata": {"name": "x"},
            "driverName": "gpu.example.com",
            "nodeName": NODE,
        },
        None,
    ),
    (
        "v1alpha2-list-own-selectors",
        "GET",
        "/apis/resource.k8s.io/v1alpha2/resourceslices?fieldSelector=nodeName%3Dnode-a,driverName%3Dgpu.example.com",
        None,
        None,
    ),
    ("discovery-apis", "GET", "/apis", None, None),
    ("discovery-group-version", "GET", "/apis/resource.k8s.io/v1", None, None),
    ("version", "GET", "/version", None, None),
    ("openapi-group", "GET", "/openapi/v3/apis/resource.k8s.io/v1", None, None),
    # The core group's document: the policy has Node (v1); kubectl explain nodes reads it.
    ("openapi-core-group", "GET", "/openapi/v3/api/v1", None, None),
]


@pytest.mark.parametrize(
    ("method", "target", "body", "current"),
    [case[1:] for case in ALLOWED],
    ids=[case[0] for case in ALLOWED],
)
def test_allowed(method: str, target: str, body: Any, current: Any) -> None:
    decision = decide(method, target, body, current)
    assert decision.allowed, decision.message
    # Forwarded, or (a plain-JSON get of the caller's object) answered with the object read.
    assert decision.target is not None or decision.response == current


REFUSED = [
    (
        "other-driver",
        GPU,
        "POST",
        SLICES,
        slice_v1(driver="nic.example.com"),
        None,
        403,
        'spec.driver "nic.example.com" does not match the calling driver "gpu.example.com"',
    ),
    (
        "other-node",
        GPU,
        "POST",
        SLICES,
        slice_v1(nodeName="node-b"),
        None,
        403,
        'spec.nodeName "node-b" does not match this node "node-a"',
    ),
    (
        "pool-not-prefixed",
        GPU,
        "POST",
        SLICES,
        slice_v1(pool={"name": "other-gpus"}),
        None,
        403,
        'spec.pool.name "other-gpus" is not prefixed by node name "node-a"',
    ),
    (
        "pool-prefix-without-separator",
        GPU,
        "POST",
        SLICES,
        slice_v1(pool={"name": "node-ab"}),
        None,
        403,
        "not prefixed by node name",
    ),
    (
        "pool-prefix-of-other-node",
        GPU,
        "POST",
        SLICES,
        slice_v1(pool={"name": "node-a-"}),
        None,
        403,
        "not prefixed by node name",
    ),
    (
        "node-selector",
        GPU,
        "POST",
        SLICES,
        slice_v1(nodeSelector={"nodeSelectorTerms": []}),
        None,
        403,
        "spec.nodeSelector is set",
    ),
    ("all-nodes", GPU, "POST", SLICES, slice_v1(allNodes=True), None, 403, "spec.allNodes is set"),
    (
        "per-device",
        GPU,
        "POST",
        SLICES,
        slice_v1(perDeviceNodeSelection=True),
        None,
        403,
        "spec.perDeviceNodeSelection is set",
    ),
    ("missing-driver", GPU, "POST", SLICES, slice_v1(driver=""), None, 403, "spec.driver is empty"),
    (
        "wrong-kind",
        GPU,
        "POST",
        SLICES,
        {**slice_v1(), "kind": "Pod"},
        None,
        400,
        "does not match the URL",
    ),
    (
        "wrong-version-in-body",
        GPU,
        "POST",
        SLICES,
        {**slice_v1(), "apiVersion": "resource.k8s.io/v1beta1"},
        None,
        400,
        "does not match the URL",
    ),
    ("no-body", GPU, "POST", SLICES, None, None, 400, "needs a JSON object body"),
    (
        "get-other-drivers",
        GPU,
        "GET",
        f"{SLICES}/node-a-gpu",
        None,
        stored(slice_v1(driver="nic.example.com")),
        403,
        "the stored object's spec.driver",
    ),
    (
        "get-other-nodes",
        GPU,
        "GET",
        f"{SLICES}/node-a-gpu",
        None,
        stored(slice_v1(nodeName="node-b")),
        403,
        "the stored object's spec.nodeName",
    ),
    ("get-missing", GPU, "GET", f"{SLICES}/nothing", None, None, 404, "not found"),
    (
        "update-takes-foreign-object",
        GPU,
        "PUT",
        f"{SLICES}/node-a-gpu",
        slice_v1(),
        stored(slice_v1(driver="nic.example.com")),
        403,
        "the stored object's spec.driver",
    ),
    (
        "update-moves-to-other-node",
        GPU,
        "PUT",
        f"{SLICES}/node-a-gpu",
        slice_v1(nodeName="node-b"),
        stored(slice_v1()),
        403,
        'spec.nodeName "node-b"',
    ),
    (
        "update-name-mismatch",
        GPU,
        "PUT",
        f"{SLICES}/node-a-gpu",
        slice_v1(name="other"),
        stored(slice_v1()),
        400,
        "does not match the name on the URL",
    ),
    ("update-missing", GPU, "PUT", f"{SLICES}/node-a-gpu", slice_v1(), None, 404, "not found"),
    (
        "delete-foreign",
        GPU,
        "DELETE",
        f"{SLICES}/node-a-gpu",
        None,
        stored(slice_v1(driver="nic.example.com")),
        403,
        "stored object",
    ),
    (
        "delete-contradicting-precondition",
        GPU,
        "DELETE",
        f"{SLICES}/node-a-gpu",
        {"preconditions": {"uid": "someone-else"}},
        stored(slice_v1()),
        409,
        "Precondition failed",
    ),
    (
        "list-without-selector",
        GPU,
        "GET",
        SLICES,
        None,
        None,
        403,
        "list requires fieldSelector spec.driver=gpu.example.com,spec.nodeName=node-a",
    ),
    (
        "list-only-node",
        GPU,
        "GET",
        f"{SLICES}?fieldSelector=spec.nodeName%3Dnode-a",
        None,
        None,
        403,
        "missing spec.driver=gpu.example.com",
    ),
    (
        "list-other-node",
        GPU,
        "GET",
        f"{SLICES}?fieldSelector=spec.nodeName%3Dnode-b,spec.driver%3Dgpu.example.com",
        None,
        None,
        403,
        'pins spec.nodeName="node-b"',
    ),
    (
        "list-not-equal-is-not-a-pin",
        GPU,
        "GET",
        f"{SLICES}?fieldSelector=spec.nodeName!%3Dnode-b,spec.driver%3Dgpu.example.com",
        None,
        None,
        403,
        "missing spec.nodeName=node-a",
    ),
    ("watch-no-selector", GPU, "GET", f"{SLICES}?watch=true", None, None, 403, "watch requires"),
    (
        "single-object-watch-unpinned",
        GPU,
        "GET",
        f"{SLICES}?watch=true&fieldSelector=metadata.name%3Dnode-a-gpu",
        None,
        None,
        403,
        "watch requires",
    ),
    (
        "deletecollection-unpinned",
        GPU,
        "DELETE",
        SLICES,
        None,
        None,
        403,
        "deletecollection requires",
    ),
    (
        "v1alpha2-with-v1-selectors",
        GPU,
        "GET",
        "/apis/resource.k8s.io/v1alpha2/resourceslices?fieldSelector=spec.nodeName%3Dnode-a,"
        "spec.driver%3Dgpu.example.com",
        None,
        None,
        403,
        "missing driverName=gpu.example.com",
    ),
    (
        "unknown-version",
        GPU,
        "GET",
        "/apis/resource.k8s.io/v9/resourceslices",
        None,
        None,
        403,
        "version v9 of resourceslices.resource.k8s.io is not in the policy",
    ),
    (
        "secrets",
        GPU,
        "GET",
        "/api/v1/namespaces/default/secrets",
        None,
        None,
        403,
        'User "gpu.example.com" cannot list resource "secrets" in API group "" '
        'in the namespace "default"',
    ),
    ("pods", GPU, "GET", "/api/v1/pods", None, None, 403, "does not allow this resource"),
    # The default policy lets a driver GET its own Node (rule OwnNode), nothing more.
    ("nodes", GPU, "PATCH", "/api/v1/nodes/node-a/status", {}, None, 403, "is not in the policy"),
    (
        "clusterroles",
        GPU,
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {},
        None,
        403,
        "does not allow",
    ),
    (
        "slices-with-namespace",
        GPU,
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/default/resourceslices/x",
        None,
        None,
        400,
        "cluster-scoped",
    ),
    (
        "unknown-subresource",
        GPU,
        "PUT",
        f"{SLICES}/x/status",
        slice_v1(name="x"),
        None,
        403,
        'subresource "status"',
    ),
    (
        "other-group-discovery",
        GPU,
        "GET",
        "/apis/rbac.authorization.k8s.io",
        None,
        None,
        403,
        "only discovery",
    ),
    ("non-resource-write", GPU, "POST", "/apis", None, None, 403, "only discovery"),
    ("healthz-upstream", GPU, "GET", "/healthz", None, None, 403, "only discovery"),
    (
        "driver-not-on-node",
        STRANGER,
        "GET",
        "/version",
        None,
        None,
        403,
        'driver "evil.example.com" is not allowed on node "node-a"',
    ),
]


@pytest.mark.parametrize(
    ("who", "method", "target", "body", "current", "code", "reason"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_refused(who, method, target, body, current, code, reason) -> None:
    decision = decide(method, target, body, current, who=who)
    assert not decision.allowed
    assert decision.code == code
    assert reason in decision.message


def test_forbidden_message_has_apiserver_phrasing() -> None:
    decision = decide("POST", SLICES, slice_v1(name="s1", pool={"name": "other-gpus"}))
    assert decision.message == (
        'resourceslices.resource.k8s.io "s1" is forbidden: User "gpu.example.com" cannot create '
        'resource "resourceslices" in API group "resource.k8s.io" at the cluster scope: '
        'spec.pool.name "other-gpus" is not prefixed by node name "node-a"'
    )
    assert decision.details == {"group": "resource.k8s.io", "kind": "resourceslices", "name": "s1"}


def test_forbidden_details_leave_out_the_core_group() -> None:
    # The apiserver's StatusDetails.group is omitempty (seen on a real 1.36 apiserver).
    decision = decide("GET", "/api/v1/namespaces/default/secrets/s1")
    assert decision.details == {"kind": "secrets", "name": "s1"}


def test_update_pins_the_fetched_resource_version() -> None:
    decision = decide("PUT", f"{SLICES}/node-a-gpu", slice_v1(), stored(slice_v1(), rv="42"))
    assert decision.body["metadata"]["resourceVersion"] == "42"


POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"


def pool_v1(name: str = "node-a", rv: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"resourceVersion": rv} if rv else {})}
    return {"apiVersion": "devmgmtproto.k8s.io/v1alpha1", "kind": "DevicePool", "metadata": meta,
            "spec": {"driver": "gpu.example.com", "nodeName": NODE}}  # fmt: skip


def test_update_with_another_resource_version_is_a_conflict() -> None:
    """Forwarding it could land the write on a version the gatekeeper never checked: a kind
    whose owner fields the apiserver may change is read and pinned."""
    decision = decide("PUT", f"{POOLS}/node-a", pool_v1(rv="41"), stored(pool_v1(), rv="42"))
    assert (decision.allowed, decision.code) == (False, 409)
    assert "the object has been modified" in decision.message


def test_an_update_carrying_its_version_of_an_immutable_owner_kind_reads_nothing() -> None:
    """docs/security.md "Updates without a read": ResourceSlice v1 asserts apiserverImmutable
    for driver, node and pool, so a body naming the caller, this node and its pool, at the
    resourceVersion the driver read, is forwarded as it is; a stale one is the apiserver's 409,
    another driver's slice the apiserver's 422."""
    body = slice_v1()
    body["metadata"]["resourceVersion"] = "41"
    info = parse_request("PUT", f"{SLICES}/node-a-gpu")
    plan = ENGINE.accept(ENGINE.screen(GPU, info), "application/json", body)
    assert not isinstance(plan, Decision) and plan.fetch is None and plan.unread
    decision = decide_offline(ENGINE, GPU, info, body, None)
    assert decision.forwards and decision.body == body
    for refused in (slice_v1(driver="nic.example.com"), slice_v1(pool={"name": "node-b/x"})):
        refused["metadata"]["resourceVersion"] = "41"
        assert not decide_offline(ENGINE, GPU, info, refused, None).allowed
    # Without a resourceVersion the stored object is read and the update pinned to it.
    assert decide("PUT", f"{SLICES}/node-a-gpu", slice_v1(), None).code == 404


def test_delete_pins_uid_and_resource_version() -> None:
    decision = decide(
        "DELETE",
        f"{SLICES}/node-a-gpu",
        {"propagationPolicy": "Background"},
        stored(slice_v1(), rv="9", uid="u-9"),
    )
    assert decision.body["preconditions"] == {"uid": "u-9", "resourceVersion": "9"}
    assert decision.body["propagationPolicy"] == "Background"


def test_lookup_fetches_the_object_for_object_verbs_only() -> None:
    assert planned_fetch(ENGINE, GPU, parse_request("GET", f"{SLICES}/x")) == f"{SLICES}/x"
    assert planned_fetch(ENGINE, GPU, parse_request("PUT", f"{SLICES}/x")) == f"{SLICES}/x"
    assert planned_fetch(ENGINE, GPU, parse_request("GET", f"{SLICES}?watch=1")) is None
    assert planned_fetch(ENGINE, GPU, parse_request("POST", SLICES)) is None
    secret = parse_request("GET", "/api/v1/namespaces/a/secrets/x")
    assert planned_fetch(ENGINE, GPU, secret) is None
    assert planned_fetch(ENGINE, STRANGER, parse_request("GET", f"{SLICES}/x")) is None
    namespaced = parse_request("GET", "/apis/resource.k8s.io/v1/namespaces/a/resourceslices/x")
    assert planned_fetch(ENGINE, GPU, namespaced) is None


def test_core_openapi_document_follows_the_policy() -> None:
    """/openapi/v3/api/<version> is open only for a core version the policy has a kind in."""
    policy = ENGINE.policy
    assert not decide("GET", "/openapi/v3/api/v2").allowed
    assert not decide("GET", "/openapi/v3/api").allowed
    without_core = Policy(
        {key: kind for key, kind in policy.kinds.items() if key[0]},
        policy.drivers,
        policy.source,
        policy.groups,
    )
    engine = Engine(without_core, NODE)
    refused = decide_offline(engine, GPU, parse_request("GET", "/openapi/v3/api/v1"))
    assert (refused.allowed, refused.code) == (False, 403)
    assert decide_offline(
        engine, GPU, parse_request("GET", "/openapi/v3/apis/resource.k8s.io/v1")
    ).allowed


def test_inject_mode_adds_missing_terms() -> None:
    policy_text = (Path(__file__).parents[2] / "gatekeeper/policies/default.yaml").read_text()
    policy_text = policy_text.replace("listSelector: Require", "listSelector: Inject")
    from gatekeeper.policyfile import parse_policy

    engine = Engine(parse_policy(policy_text).with_drivers(frozenset({GPU.driver})), NODE)
    decision = decide_offline(
        engine, GPU, parse_request("GET", f"{SLICES}?fieldSelector=spec.nodeName%3Dnode-a")
    )
    assert decision.allowed
    assert (
        decision.target.query_value("fieldSelector")
        == "spec.nodeName=node-a,spec.driver=gpu.example.com"
    )
    refused = decide_offline(
        engine, GPU, parse_request("GET", f"{SLICES}?fieldSelector=spec.nodeName%3Dnode-b")
    )
    assert not refused.allowed


def test_engine_modules_do_no_io() -> None:
    """STYLE rule 4: the engine imports nothing that does I/O, keeps time or logs."""
    forbidden = {"aiohttp", "asyncio", "os", "time", "datetime", "logging", "socket", "ssl"}
    package = Path(__file__).parents[2] / "gatekeeper" / "policy"
    for module in ("engine.py", "decision.py", "ownership.py", "model.py"):
        tree = ast.parse((package / module).read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{module} imports {name}"
