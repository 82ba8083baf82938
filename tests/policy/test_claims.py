"""Rule AllocatedToDriver, purely: scope, node selectors, status writes, the engine's answers."""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.listen.identity import Identity
from gatekeeper.policy import Engine
from gatekeeper.policy.changes import first_difference
from gatekeeper.policy.engine import ANSWERED_FROM_READ
from gatekeeper.policy.nodeselector import selects_node
from gatekeeper.policy.patching import JSON_PATCH, MERGE_PATCH
from gatekeeper.policy.plan import Plan
from gatekeeper.policy.stored import Stored, predict
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import decide_offline, planned_fetch

NODE = "node-a"
GPU = Identity(driver="gpu.example.com", transport="unix")
NIC = Identity(driver="nic.example.com", transport="unix")
ENGINE = Engine(load_policy(None).with_drivers(frozenset({GPU.driver, NIC.driver})), NODE)
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
STATUS = f"{CLAIMS}/c1/status"


def by_name(*nodes: str, operator: str = "In") -> dict[str, Any]:
    fields = [{"key": "metadata.name", "operator": operator, "values": list(nodes)}]
    return {"nodeSelectorTerms": [{"matchFields": fields}]}


def by_label(key: str, operator: str, *values: str) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = list(values)
    return {"nodeSelectorTerms": [{"matchExpressions": [expression]}]}


def claim(
    driver: str = GPU.driver,
    selector: Any = None,
    devices: list[dict[str, Any]] | None = None,
    version: str = "v1",
    rv: str = "7",
) -> dict[str, Any]:
    """Claim ``c1`` allocated to ``driver`` (a result per driver in a list) on node-a."""
    drivers = driver if isinstance(driver, list) else [driver]
    obj: dict[str, Any] = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "c1",
            "namespace": "default",
            "uid": "u1",
            "resourceVersion": rv,
            "labels": {"app": "x"},
        },
        "spec": {"devices": {"requests": [{"name": "req"}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "req", "driver": d, "pool": NODE, "device": f"dev-{i}"}
                        for i, d in enumerate(drivers)
                    ]
                },
                "nodeSelector": by_name(NODE) if selector is None else selector,
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "p1"}],
        },
    }
    if devices is not None:
        obj["status"]["devices"] = devices
    return obj


def entry(driver: str = GPU.driver, device: str = "dev-0", ready: str = "True") -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": NODE,
        "device": device,
        "conditions": [{"type": "Ready", "status": ready}],
    }


def unallocated() -> dict[str, Any]:
    obj = claim()
    del obj["status"]["allocation"]
    return obj


def decide(
    method: str,
    target: str,
    body: Any = None,
    current: Any = None,
    who: Identity = GPU,
    media_type: str = "application/json",
    engine: Engine = ENGINE,
):
    info = parse_request(method, target)
    return decide_offline(engine, who, info, body, current, media_type=media_type)


# --- the scope: a result of the driver, on this node ----------------------------------------

SCOPE = [
    ("own-by-node-name", claim(), True),
    ("own-among-other-drivers", claim([NIC.driver, GPU.driver]), True),
    ("other-driver", claim(NIC.driver), False),
    ("other-node", claim(selector=by_name("node-b")), False),
    ("several-nodes-including-this", claim(selector=by_name("node-b", NODE)), True),
    ("name-not-in-other-node", claim(selector=by_name("node-b", operator="NotIn")), True),
    ("name-not-in-this-node", claim(selector=by_name(NODE, operator="NotIn")), False),
    ("hostname-label", claim(selector=by_label("kubernetes.io/hostname", "In", NODE)), True),
    ("hostname-label-other", claim(selector=by_label("kubernetes.io/hostname", "In", "b")), False),
    ("unknown-label-in", claim(selector=by_label("zone", "In", "z1")), False),
    ("unknown-label-notin-fails-closed", claim(selector=by_label("zone", "NotIn", "z")), False),
    ("unknown-label-absent-fails-closed", claim(selector=by_label("zone", "DoesNotExist")), False),
    ("hostname-exists", claim(selector=by_label("kubernetes.io/hostname", "Exists")), True),
    ("no-node-selector", claim(selector={}), False),
    ("empty-terms", claim(selector={"nodeSelectorTerms": []}), False),
    ("empty-term", claim(selector={"nodeSelectorTerms": [{}]}), False),
    ("bad-operator", claim(selector=by_name(NODE, operator="Exists")), False),
    ("unallocated", unallocated(), False),
    (
        "results-not-a-list",
        {**claim(), "status": {"allocation": {"devices": {"results": {}}}}},
        False,
    ),
    ("v1beta1-layout", claim(version="v1beta1"), True),
]


@pytest.mark.parametrize(("obj", "visible"), [c[1:] for c in SCOPE], ids=[c[0] for c in SCOPE])
def test_get_sees_only_claims_in_scope(obj: dict[str, Any], visible: bool) -> None:
    target = f"/apis/{obj['apiVersion']}/namespaces/default/resourceclaims/c1"
    decision = decide("GET", target, current=obj)
    assert decision.allowed is visible, decision.message
    if visible:
        # The claim read and checked is the answer: one read, and nothing else can slip in.
        assert (decision.reason, decision.response) == (ANSWERED_FROM_READ, obj)
        # A form the read cannot answer (kubectl's Table) is forwarded, and filtered again.
        info = parse_request("GET", target)
        forwarded = decide_offline(ENGINE, GPU, info, current=obj, accept=TABLE)
        assert forwarded.filter is not None and forwarded.filter(obj)
    else:
        # SECURITY: out of scope is indistinguishable from absent.
        assert decision.code == 404
        assert decision.message == 'resourceclaims.resource.k8s.io "c1" not found'
        assert decide("GET", target, current=None).message == decision.message


LABELS = [
    (
        "label-given",
        {"topology.example.com/rack": "r1"},
        by_label("topology.example.com/rack", "In", "r1"),
        True,
    ),
    ("label-gt", {"gpus": "8"}, by_label("gpus", "Gt", "4"), True),
    ("label-lt-false", {"gpus": "8"}, by_label("gpus", "Lt", "4"), False),
    ("label-notin-known", {"zone": "z1"}, by_label("zone", "NotIn", "z2"), True),
    ("label-absent-known-not-assumed", {"zone": "z1"}, by_label("rack", "DoesNotExist"), False),
    (
        "hostname-overridden",
        {"kubernetes.io/hostname": "host-a"},
        by_label("kubernetes.io/hostname", "In", "host-a"),
        True,
    ),
    (
        "hostname-overridden-not-node-name",
        {"kubernetes.io/hostname": "host-a"},
        by_label("kubernetes.io/hostname", "In", NODE),
        False,
    ),
    (
        "and-within-term",
        {"zone": "z1"},
        {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}],
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["node-b"]}
                    ],
                }
            ]
        },
        False,
    ),
    (
        "or-across-terms",
        {},
        {
            "nodeSelectorTerms": [
                by_name("node-b")["nodeSelectorTerms"][0],
                by_name(NODE)["nodeSelectorTerms"][0],
            ]
        },
        True,
    ),
]


@pytest.mark.parametrize(
    ("labels", "selector", "selected"), [c[1:] for c in LABELS], ids=[c[0] for c in LABELS]
)
def test_node_labels_are_data(labels: dict[str, str], selector: Any, selected: bool) -> None:
    engine = Engine(ENGINE.policy, NODE, node_labels=labels)
    obj = claim(selector=selector)
    assert decide("GET", f"{CLAIMS}/c1", current=obj, engine=engine).allowed is selected


def test_selector_requirement_shapes_fail_closed() -> None:
    assert not selects_node(None, NODE, {})
    assert not selects_node({"nodeSelectorTerms": "x"}, NODE, {})
    assert not selects_node({"nodeSelectorTerms": [{"matchFields": [{"key": 1}]}]}, NODE, {})
    bad_field = {"key": "spec.unschedulable", "operator": "In", "values": ["false"]}
    assert not selects_node({"nodeSelectorTerms": [{"matchFields": [bad_field]}]}, NODE, {})


def test_list_and_watch_carry_the_filter() -> None:
    for target in (CLAIMS, "/apis/resource.k8s.io/v1/resourceclaims?watch=true"):
        decision = decide("GET", target)
        assert decision.allowed and decision.filter is not None
        assert decision.filter(claim()) and not decision.filter(claim(NIC.driver))
        assert decision.target is not None and decision.target.target == target
    other = decide("GET", CLAIMS, who=NIC).filter
    assert other is not None and not other(claim()) and other(claim(NIC.driver))


# --- status writes: only the caller's own status.devices entries ---------------------------


def with_status(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    obj = copy.deepcopy(base)
    obj["status"].update(changes)
    return obj


STORED = claim([GPU.driver, NIC.driver], devices=[entry(NIC.driver, "dev-1")])


def changed(path: tuple[str, ...], value: Any, base: dict[str, Any] = STORED) -> dict[str, Any]:
    obj = copy.deepcopy(base)
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return obj


WRITES = [
    ("add-own-entry", with_status(STORED, devices=[entry(NIC.driver, "dev-1"), entry()]), None),
    (
        "add-own-entry-first",
        with_status(STORED, devices=[entry(), entry(NIC.driver, "dev-1")]),
        None,
    ),
    ("no-change", STORED, None),
    # The apiserver's own bookkeeping: a driver's write neither forges nor clears it.
    (
        "set-managed-fields",
        changed(("metadata", "managedFields"), [{"manager": "x"}]),
        "metadata.managedFields is maintained by the apiserver",
    ),
    (
        "add-other-driver-entry",
        with_status(STORED, devices=[entry(NIC.driver, "dev-1"), entry(NIC.driver, "dev-9")]),
        'status.devices[1] is added for driver "nic.example.com"',
    ),
    (
        "modify-other-driver-entry",
        with_status(STORED, devices=[entry(NIC.driver, "dev-1", ready="False")]),
        "status.devices[0].conditions[0].status differs from the stored object "
        '(driver "nic.example.com")',
    ),
    (
        "remove-other-driver-entry",
        with_status(STORED, devices=[entry()]),
        'status.devices[0] of driver "nic.example.com" is removed',
    ),
    (
        "entry-without-driver",
        with_status(STORED, devices=[entry(NIC.driver, "dev-1"), {"device": "x"}]),
        "status.devices[1] is added for no driver",
    ),
    (
        "change-allocation",
        changed(("status", "allocation", "devices", "results", 0, "device"), "dev-9"),
        "status.allocation.devices.results[0].device differs from the stored object",
    ),
    (
        "change-node-selector",
        changed(("status", "allocation", "nodeSelector"), by_name("node-b")),
        "status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values[0] differs",
    ),
    (
        "change-reserved-for",
        changed(("status", "reservedFor"), []),
        "status.reservedFor[0] differs from the stored object",
    ),
    (
        "change-label",
        changed(("metadata", "labels"), {"app": "x", "evil": "1"}),
        "metadata.labels.evil differs from the stored object",
    ),
    (
        "change-annotation-with-dots",
        changed(("metadata", "annotations"), {"a.b/c": "1"}),
        "metadata.annotations differs from the stored object",
    ),
    (
        "change-spec",
        changed(("spec", "devices"), {}),
        "spec.devices.requests differs from the stored object",
    ),
    ("devices-not-a-list", with_status(STORED, devices={"x": 1}), "status.devices must be a list"),
]


def put(obj: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(obj)
    body["metadata"].pop("resourceVersion", None)
    return body


@pytest.mark.parametrize(("body", "refusal"), [c[1:] for c in WRITES], ids=[c[0] for c in WRITES])
def test_status_update(body: dict[str, Any], refusal: str | None) -> None:
    decision = decide("PUT", STATUS, put(body), STORED)
    if refusal is None:
        assert decision.allowed, decision.message
        assert decision.body["metadata"]["resourceVersion"] == "7"  # pinned (DESIGN §4.4)
        assert decision.target is not None and decision.target.path == STATUS
    else:
        assert (decision.allowed, decision.code) == (False, 403)
        assert refusal in decision.message, decision.message
        assert decision.message.startswith(
            'resourceclaims.resource.k8s.io "c1" is forbidden: User "gpu.example.com" cannot '
            'update resource "resourceclaims/status" in API group "resource.k8s.io" in the '
            'namespace "default": '
        )


@pytest.mark.parametrize(("body", "refusal"), [c[1:] for c in WRITES], ids=[c[0] for c in WRITES])
def test_status_patch_decides_on_the_result(body: dict[str, Any], refusal: str | None) -> None:
    import jsonpatch

    patch = jsonpatch.make_patch(STORED, body).patch
    decision = decide("PATCH", STATUS, patch, STORED, media_type=JSON_PATCH)
    assert decision.allowed is (refusal is None), decision.message
    if refusal is None:
        assert decision.body[0] == {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": "7",
        }
    else:
        assert "after the patch, " + refusal.split(" differs")[0] in decision.message


def test_merge_patch_of_the_devices_list_replaces_it() -> None:
    """A merge patch replaces the whole list: dropping another driver's entry is refused."""
    patch = {"status": {"devices": [entry(ready="False")]}}
    decision = decide("PATCH", STATUS, patch, STORED, media_type=MERGE_PATCH)
    assert not decision.allowed
    assert 'status.devices[0] of driver "nic.example.com" is removed' in decision.message
    own_only = claim(devices=[entry()])
    decision = decide("PATCH", STATUS, patch, own_only, media_type=MERGE_PATCH)
    assert decision.allowed, decision.message
    assert decision.body["metadata"]["resourceVersion"] == "7"


def test_strategic_merge_decides_on_the_upstream_preview() -> None:
    proposed = with_status(STORED, devices=[entry(NIC.driver, "dev-1"), entry()])
    request = parse_request("PATCH", STATUS)
    patch = {"status": {"devices": [entry()]}}
    decision = decide_offline(
        ENGINE,
        GPU,
        request,
        patch,
        STORED,
        media_type="application/strategic-merge-patch+json",
        proposed=proposed,
    )
    assert decision.allowed, decision.message
    plan = ENGINE.plan(GPU, request, "application/strategic-merge-patch+json")
    assert isinstance(plan, Plan)
    asked = predict(plan, patch, STORED)
    assert isinstance(asked, Stored) and asked.preview is not None
    assert predict(plan, patch, claim(NIC.driver)) is None


REFUSED = [
    ("put-main-resource", "PUT", f"{CLAIMS}/c1", put(STORED), STORED, 403, "status subresource"),
    ("patch-main-resource", "PATCH", f"{CLAIMS}/c1", {}, STORED, 403, "status subresource"),
    ("create", "POST", CLAIMS, put(STORED), None, 403, "not allowed"),
    ("delete", "DELETE", f"{CLAIMS}/c1", None, STORED, 403, "not allowed"),
    ("deletecollection", "DELETE", CLAIMS, None, None, 403, "not allowed"),
    (
        "status-of-other-driver",
        "PUT",
        STATUS,
        put(claim(NIC.driver)),
        claim(NIC.driver),
        404,
        "not found",
    ),
    (
        "status-of-other-node",
        "PUT",
        STATUS,
        put(claim(selector=by_name("b"))),
        claim(selector=by_name("b")),
        404,
        "not found",
    ),
    ("status-of-missing", "PUT", STATUS, put(STORED), None, 404, "not found"),
    (
        "stale-resource-version",
        "PUT",
        STATUS,
        {**put(STORED), "metadata": {**STORED["metadata"], "resourceVersion": "6"}},
        STORED,
        409,
        "has been modified",
    ),
    ("kind-mismatch", "PUT", STATUS, {**put(STORED), "kind": "Pod"}, STORED, 400, "does not match"),
    (
        "version-not-in-policy",
        "GET",
        "/apis/resource.k8s.io/v1alpha2/namespaces/default/resourceclaims",
        None,
        None,
        403,
        "not in the policy",
    ),
    ("other-subresource", "GET", f"{CLAIMS}/c1/binding", None, None, 403, "subresource"),
    (
        "no-namespace",
        "GET",
        "/apis/resource.k8s.io/v1/resourceclaims/c1",
        None,
        None,
        400,
        "namespaced",
    ),
]


@pytest.mark.parametrize(
    ("method", "target", "body", "current", "code", "reason"),
    [c[1:] for c in REFUSED],
    ids=[c[0] for c in REFUSED],
)
def test_refused(method: str, target: str, body: Any, current: Any, code: int, reason: str) -> None:
    decision = decide(method, target, body, current)
    assert (decision.allowed, decision.code) == (False, code), decision.message
    assert reason in decision.message


def test_lookup_fetches_only_what_may_proceed() -> None:
    assert planned_fetch(ENGINE, GPU, parse_request("GET", f"{CLAIMS}/c1")) == f"{CLAIMS}/c1"
    assert planned_fetch(ENGINE, GPU, parse_request("PUT", STATUS)) == f"{CLAIMS}/c1"
    assert planned_fetch(ENGINE, GPU, parse_request("GET", STATUS)) == f"{CLAIMS}/c1"
    # Refused on the request alone: nothing is fetched.
    assert planned_fetch(ENGINE, GPU, parse_request("PUT", f"{CLAIMS}/c1")) is None
    assert planned_fetch(ENGINE, GPU, parse_request("DELETE", f"{CLAIMS}/c1")) is None
    assert planned_fetch(ENGINE, GPU, parse_request("GET", CLAIMS)) is None


def test_first_difference_names_paths() -> None:
    assert first_difference({"a": 1}, {"a": 1}) is None
    assert first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == "a.b[1]"
    assert first_difference({"a": [1]}, {"a": [1, 2]}) == "a[1]"
    assert first_difference({"m": {"x.y/z": 1}}, {"m": {"x.y/z": 2}}) == 'm["x.y/z"]'
    assert first_difference({}, {"new": 1}) == "new"
    assert first_difference(1, 2) == "the object"


def test_claim_modules_do_no_io() -> None:
    """STYLE rule 4 for the modules of this rule (datetime is arithmetic here: that no policy
    module reads the clock is tests/policy/test_purity.py's)."""
    forbidden = {"aiohttp", "asyncio", "os", "time", "logging", "socket", "ssl"}
    package = Path(__file__).parents[2] / "gatekeeper" / "policy"
    for module in ("claims.py", "nodeselector.py", "integrity.py"):
        for node in ast.walk(ast.parse((package / module).read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & forbidden, (module, names)
