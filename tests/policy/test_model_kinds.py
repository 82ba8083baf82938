"""Policy data: per-version ``apiserverImmutable`` ownership fields, rule OwnNode (the node's
own Node, read-only) and the ``opaque`` paths of claims; loaded, refused when wrong, decided."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.errors import ConfigError
from gatekeeper.listen.identity import Identity
from gatekeeper.policy import Engine, KindRule
from gatekeeper.policy.model import Field
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import decide_offline, planned_fetch

HEAD = "apiVersion: dra-gatekeeper.io/v1alpha1\nkind: Policy\ndrivers: [gpu.example.com]\n"
SLICE = """\
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    verbs: [get, list, watch, create, update, patch, delete, deletecollection]
    versions:
      - {names: [v1], driver: spec.driver, node: spec.nodeName, pool: spec.pool.name%s}
"""
NODES = """\
  - group: ""
    resource: nodes
    kind: Node
    scope: %s
    rule: OwnNode
%s    versions:
      - {names: [v1]%s}
"""
CLAIM = """\
  - group: resource.k8s.io
    resource: resourceclaims
    kind: ResourceClaim
    scope: Namespaced
    rule: AllocatedToDriver
    verbs: [get, list, watch, update, patch]
    subresources: [status]
    versions:
      - names: [v1]
        results: status.allocation.devices.results
        resultDriver: driver
        nodeSelector: status.allocation.nodeSelector
        devices: status.devices
        deviceDriver: driver
        opaque: %s
"""


def slices(extra: str = "") -> str:
    return HEAD + "kinds:\n" + SLICE % extra


def nodes(scope: str = "Cluster", extra: str = "    verbs: [get]\n", version: str = "") -> str:
    return HEAD + "kinds:\n" + SLICE % "" + NODES % (scope, extra, version)


def test_the_default_policy_declares_apiserver_immutable_ownership_per_version() -> None:
    policy = load_policy(None)
    slice_kind = policy.kind_for("resource.k8s.io", "resourceslices")
    assert slice_kind is not None
    for version in ("v1", "v1beta2", "v1beta1", "v1alpha3"):
        spec = slice_kind.versions[version]
        assert spec.apiserver_immutable == {Field.DRIVER, Field.NODE, Field.POOL}, version
        assert spec.owner_fields_immutable, version
    # v1alpha2 (Kubernetes 1.30) had no pool; driverName and nodeName were immutable.
    assert slice_kind.versions["v1alpha2"].owner_fields_immutable
    pools = policy.kind_for("devmgmtproto.k8s.io", "devicepools")
    assert pools is not None and not pools.versions["v1alpha1"].owner_fields_immutable


def test_apiserver_immutable_must_cover_every_located_field_to_count() -> None:
    policy = parse_policy(slices(", apiserverImmutable: [driver, node]"))
    spec = policy.kinds[("resource.k8s.io", "resourceslices")].versions["v1"]
    assert spec.apiserver_immutable == {Field.DRIVER, Field.NODE}
    assert not spec.owner_fields_immutable, "the pool can still change: not enough"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            slices(", apiserverImmutable: [driver, name]"),
            "kinds[0].versions[0].apiserverImmutable[1]: 'name' is not",
        ),
        (
            slices(", apiserverImmutable: driver"),
            "kinds[0].versions[0].apiserverImmutable: must be a list",
        ),
        (
            HEAD
            + "kinds:\n"
            + SLICE.replace(", pool: spec.pool.name", "") % ", apiserverImmutable: [pool]",
            "kinds[0].versions[0].apiserverImmutable: names pool, which has no path here",
        ),
        (nodes(scope="Namespaced"), "kinds[1].scope: must be Cluster (rule OwnNode)"),
        (
            nodes(extra="    verbs: [get, create]\n"),
            "kinds[1].verbs[1]: 'create' is not one of get, list, watch, update, patch "
            "(rule OwnNode)",
        ),
        (
            nodes(extra="    verbs: [get]\n    subresources: [status]\n"),
            "kinds[1].subresources: must be empty (rule OwnNode)",
        ),
        (
            nodes(extra="    verbs: [get]\n    fill: [node]\n"),
            "kinds[1].fill: is not allowed (rule OwnNode)",
        ),
        (nodes(version=", driver: spec.driver"), "kinds[1].versions[0].driver: unknown key"),
        (
            HEAD + "kinds:\n" + CLAIM % '["status.devices[0].data"]',
            "versions[0].opaque[0]: 'status.devices[0].data' is not a field path",
        ),
        (HEAD + "kinds:\n" + CLAIM % "status.devices.data", "versions[0].opaque: must be a list"),
    ],
    ids=[
        "apiserver-immutable-unknown-field",
        "apiserver-immutable-not-a-list",
        "apiserver-immutable-unlocated",
        "own-node-namespaced",
        "own-node-create",
        "own-node-subresource",
        "own-node-fill",
        "own-node-paths",
        "opaque-bad-path",
        "opaque-not-a-list",
    ],
)
def test_bad_policy_data_is_refused_at_load(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_policy(text, "p.yaml")
    assert message in str(raised.value), str(raised.value)


@pytest.mark.parametrize(
    ("times", "message"),
    [
        ("[status.devices.data.at]", "times[0]: status.devices.data.at is under opaque"),
        ('["status.devices[0].at"]', "times[0]: 'status.devices[0].at' is not a field path"),
        ("status.devices.at", "versions[0].times: must be a list"),
    ],
    ids=["under-opaque", "bad-path", "not-a-list"],
)
def test_bad_time_paths_are_refused_at_load(times: str, message: str) -> None:
    text = HEAD + "kinds:\n" + CLAIM % "[status.devices.data]" + f"        times: {times}\n"
    with pytest.raises(ConfigError) as raised:
        parse_policy(text, "p.yaml")
    assert message in str(raised.value), str(raised.value)


def test_time_paths_load() -> None:
    text = HEAD + "kinds:\n" + CLAIM % "[]" + "        times: [status.devices.conditions.at]\n"
    allocation = parse_policy(text).kinds[("resource.k8s.io", "resourceclaims")].versions["v1"]
    assert allocation.allocation is not None
    assert allocation.allocation.times == (("status", "devices", "conditions", "at"),)


def test_opaque_paths_load() -> None:
    policy = parse_policy(HEAD + "kinds:\n" + CLAIM % "[status.devices.data]")
    allocation = policy.kinds[("resource.k8s.io", "resourceclaims")].versions["v1"].allocation
    assert allocation is not None and allocation.opaque == (("status", "devices", "data"),)


def test_the_core_group_opens_no_discovery_path() -> None:
    policy = parse_policy(nodes())
    assert policy.kinds[("", "nodes")].rule is KindRule.OWN_NODE
    assert policy.groups == {"resource.k8s.io"}


GPU = Identity(driver="gpu.example.com", transport="unix")
ENGINE = Engine(load_policy(None).with_drivers(frozenset({GPU.driver})), "node-a")

OWN_NODE_ONLY = "a driver may only get this node's own Node"
# (id, method, target, allowed, code, part of the message)
NODE_REQUESTS: list[tuple[str, str, str, bool, int, str]] = [
    ("own-node", "GET", "/api/v1/nodes/node-a", True, 0, ""),
    ("own-node-head", "HEAD", "/api/v1/nodes/node-a", True, 0, ""),
    ("other-node", "GET", "/api/v1/nodes/node-b", False, 403, 'own Node "node-a"'),
    ("list", "GET", "/api/v1/nodes", False, 403, OWN_NODE_ONLY),
    ("list-own-name", "GET", "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-a", False, 403, ""),
    ("watch", "GET", "/api/v1/nodes?watch=true", False, 403, OWN_NODE_ONLY),
    ("status", "GET", "/api/v1/nodes/node-a/status", False, 403, 'subresource "status"'),
    ("proxy", "GET", "/api/v1/nodes/node-a/proxy", False, 403, 'subresource "proxy"'),
    ("update", "PUT", "/api/v1/nodes/node-a", False, 403, OWN_NODE_ONLY),
    ("patch", "PATCH", "/api/v1/nodes/node-a", False, 403, OWN_NODE_ONLY),
    ("delete", "DELETE", "/api/v1/nodes/node-a", False, 403, OWN_NODE_ONLY),
    ("create", "POST", "/api/v1/nodes", False, 403, OWN_NODE_ONLY),
    ("other-version", "GET", "/api/v1beta1/nodes/node-a", False, 403, "not in the policy"),
]


@pytest.mark.parametrize(
    ("method", "target", "allowed", "code", "message"),
    [c[1:] for c in NODE_REQUESTS],
    ids=[c[0] for c in NODE_REQUESTS],
)
def test_a_driver_reads_only_its_own_node(
    method: str, target: str, allowed: bool, code: int, message: str
) -> None:
    info = parse_request(method, target)
    body: Any = {} if method in ("PUT", "PATCH", "POST") else None
    decision = decide_offline(ENGINE, GPU, info, body, None)
    assert decision.allowed is allowed, decision.message
    if allowed:
        assert decision.target == info and decision.filter is None
        assert planned_fetch(ENGINE, GPU, info) is None, (
            "nothing to fetch for the node's own object"
        )
    else:
        assert decision.code == code and message in decision.message, decision.message


def test_a_built_in_kind_takes_client_gos_protobuf_by_default_a_custom_one_json() -> None:
    """client-go's typed clients write built-in kinds as protobuf and never fall back on a 415
    (a Lease's leader election retried for ever): unless the policy says otherwise, the
    gatekeeper accepts what the apiserver can decode in a dry run, and nothing more."""
    text = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
kinds:
  - {group: coordination.k8s.io, resource: leases, kind: Lease, scope: Namespaced,
     rule: DriverNamespace, verbs: [get, create, update], versions: [{names: [v1]}]}
  - {group: example.com, resource: widgets, kind: Widget, scope: Namespaced,
     rule: DriverNamespace, verbs: [get, create, update], versions: [{names: [v1]}]}
"""
    policy = parse_policy(text)
    assert policy.kinds[("coordination.k8s.io", "leases")].encodings == {"json", "protobuf"}
    assert policy.kinds[("example.com", "widgets")].encodings == {"json"}


WIDGETS = """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
kinds:
  - {group: example.com, resource: widgets, kind: Widget, scope: Namespaced, rule: %s,
     verbs: [get, create, update], encodings: %s, versions: [{names: [v1]}]}
"""


def test_a_custom_resource_under_the_gatekeepers_credentials_takes_no_protobuf(
    tmp_path: Any,
) -> None:
    """kube-apiserver 1.36.3 panics on a protobuf write of a custom resource: a policy that
    would have the gatekeeper's dry run meet that is refused when it loads, naming the file,
    the kind and why."""
    path = tmp_path / "widgets.yaml"
    path.write_text(WIDGETS % ("DriverNamespace", "[json, protobuf]"))
    with pytest.raises(ConfigError) as refused:
        load_policy(str(path))
    message = str(refused.value)
    assert message.startswith(f"{path}:5: kinds[0].encodings: widgets.example.com is a custom "
                              "resource"), message  # fmt: skip
    assert "panics on a protobuf write" in message
    # What stays allowed: CBOR for it, protobuf for a built-in kind, and protobuf left to the
    # driver's own credentials (the apiserver's RBAC for the driver decides; nothing of the
    # gatekeeper's is sent).
    path.write_text(WIDGETS % ("DriverNamespace", "[json, cbor]"))
    assert load_policy(str(path)).kinds[("example.com", "widgets")].encodings == {"json", "cbor"}
    path.write_text(WIDGETS % ("DriverCredentials", "[json, protobuf]"))
    assert "protobuf" in load_policy(str(path)).kinds[("example.com", "widgets")].encodings
    path.write_text((WIDGETS % ("DriverNamespace", "[json, protobuf]")).replace(
        "example.com", "coordination.k8s.io").replace("widgets", "leases"))  # fmt: skip
    leases = load_policy(str(path)).kinds[("coordination.k8s.io", "leases")]
    assert leases.encodings == {"json", "protobuf"}
