"""``audit generate`` proposes each rule of the language from what a kube-apiserver log shows of a
driver: this node's Node, the caller's own pod, objects on this node, the driver's namespace, a
CEL scope, the driver's own credentials. The policy it writes loads, allows the logged requests,
and still refuses their neighbours (another node, another pod, another label, another namespace).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gatekeeper.audit.tools.generate import generate_policy
from gatekeeper.audit.tools.reader import Record, to_record
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Engine, KindRule, ListSelectorMode, Policy
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import GPU, NODE, SLICES, decide_offline, slice_body
from gatekeeper.types import Identity
from tests.audit.driverday import OWN_POD, POD_UID, RULES
from tests.audit.logs import SA_GPU, apiserver_event
from tests.audit.records import record

BASE = load_policy(None)
NODE_PATH = f"/api/v1/nodes/{NODE}"
PODS = "/api/v1/pods"
ON_NODE = "fieldSelector=spec.nodeName%3Dnode-a"
EVENTS = "/api/v1/namespaces/gpu-system/events"
DOMAINS = "/apis/resource.nvidia.com/v1beta1/computedomains"


def logged(*calls: tuple[Any, ...]) -> list[Record]:
    """(verb, uri[, request body[, response body]]) as the kube-apiserver logs a driver's
    ServiceAccount, mapped to the driver as --driver-user does."""
    records = []
    for index, (verb, uri, *bodies) in enumerate(calls):
        request, response = [*bodies, None, None][:2]
        event = apiserver_event(
            verb, uri, SA_GPU, index=index, request_object=request, response_object=response
        )
        records.append(to_record(event, {SA_GPU: GPU}))
    return records


def generated(records: list[Record], base: Policy = BASE) -> tuple[str, Policy]:
    text = generate_policy(records, base)
    return text, parse_policy(text, "generated.yaml")


def notes(text: str) -> str:
    """The header, each note on one line (the file wraps them)."""
    return text.split("\napiVersion:")[0].replace("\n#   ", " ")


def entries(text: str, resource: str) -> dict[str, dict[str, Any]]:
    """The generated entries of ``resource``, by rule."""
    doc = yaml.safe_load(text)
    return {kind["rule"]: kind for kind in doc["kinds"] if kind["resource"] == resource}


def token_caller(records: list[Record]) -> Identity:
    assert records[0].token_user is not None  # the reader keeps the ServiceAccount's token
    return Identity(GPU, ListenerKind.TOKEN, user=records[0].token_user)


ALLOWED = 0


def decide(policy: Policy, who: Identity, method: str, uri: str, body: Any = None,
           current: Any = None) -> int:  # fmt: skip
    """0 when the generated policy allows the request, else the refusal's code."""
    decision = decide_offline(Engine(policy, NODE), who, parse_request(method, uri), body, current)
    return ALLOWED if decision.allowed else decision.code


def node(labels: dict[str, str]) -> dict[str, Any]:
    meta = {"name": NODE, "resourceVersion": "1", "labels": labels}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def pod(name: str, namespace: str, on: str = NODE, uid: str = POD_UID) -> dict[str, Any]:
    meta = {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": on}}


def labels(*keys: str) -> dict[str, Any]:
    return {"metadata": {"labels": dict.fromkeys(keys, "x")}}


def test_the_own_node_read_and_label_patches_become_own_node_with_may_change() -> None:
    records = logged(
        ("get", NODE_PATH),
        ("patch", NODE_PATH, labels("nvidia.com/gpu.clique")),
        ("patch", NODE_PATH, [{"op": "add", "path": "/metadata/labels/example.com~1zone",
                               "value": "a"}]),
    )  # fmt: skip
    text, policy = generated(records)
    nodes = entries(text, "nodes")["OwnNode"]
    assert nodes["verbs"] == ["get", "patch"]
    assert nodes["versions"] == [
        {"names": ["v1"], "mayChange": [{"path": "metadata.labels",
                                         "keys": ["example.com/zone", "nvidia.com/gpu.clique"]}]}
    ]  # fmt: skip
    who = token_caller(records)
    stored = node({"kubernetes.io/hostname": NODE})
    patch = labels("nvidia.com/gpu.clique")
    assert decide(policy, who, "PATCH", NODE_PATH, patch, stored) == ALLOWED
    hostname = {"metadata": {"labels": {"kubernetes.io/hostname": "evil"}}}
    assert decide(policy, who, "PATCH", NODE_PATH, hostname, stored) == 403
    assert decide(policy, who, "PATCH", "/api/v1/nodes/node-b", patch, stored) != ALLOWED


def test_without_bodies_the_header_says_may_change_must_be_written() -> None:
    text, policy = generated(logged(("patch", NODE_PATH), ("patch", NODE_PATH), ("patch", OWN_POD)))
    assert (
        "# REVIEW: nodes (rule OwnNode): mayChange must be written: the log holds none of what "
        "its 2 update/patch requests changed"
    ) in notes(text)
    assert "# REVIEW: pods (rule OwnPod): mayChange must be written" in notes(text)
    own_node = policy.kind_for("", "nodes", "patch")
    assert own_node is not None and own_node.rule is KindRule.OWN_NODE
    (placeholder,) = own_node.versions["v1"].may_change
    assert placeholder.keys == (f"{GPU}/*",)


def test_an_update_is_diffed_against_the_object_the_log_showed_before_it() -> None:
    before = node({"kubernetes.io/hostname": NODE, "a": "1"})
    after = node({"kubernetes.io/hostname": NODE, "a": "2", "example.com/b": "3"})
    text, _ = generated(logged(("get", NODE_PATH, None, before), ("update", NODE_PATH, after)))
    (version,) = entries(text, "nodes")["OwnNode"]["versions"]
    assert version["mayChange"] == [{"path": "metadata.labels", "keys": ["a", "example.com/b"]}]
    # Without the object before it, what an update changed is unknown: said, not guessed.
    text, _ = generated(logged(("patch", NODE_PATH, labels("c")), ("update", NODE_PATH, after)))
    (version,) = entries(text, "nodes")["OwnNode"]["versions"]
    assert version["mayChange"] == [{"path": "metadata.labels", "keys": ["c"]}]
    assert "1 more (e.g. update /api/v1/nodes/node-a) are not shown by the log" in notes(text)


def test_pods_on_the_node_and_the_own_pod_become_two_entries_with_disjoint_verbs() -> None:
    records = logged(
        ("list", f"{PODS}?{ON_NODE}&limit=500"),
        ("watch", f"{PODS}?{ON_NODE}&watch=true"),
        ("get", "/api/v1/namespaces/default/pods/job", None, pod("job", "default", uid="j")),
        ("patch", OWN_POD, labels("nvidia.com/gpu.ready")),
    )
    text, policy = generated(records)
    pods = entries(text, "pods")
    assert set(pods) == {"OnNode", "OwnPod"}
    assert pods["OnNode"]["verbs"] == ["get", "list", "watch"]
    assert pods["OnNode"]["listSelector"] == ListSelectorMode.REQUIRE.value
    assert pods["OnNode"]["versions"] == [{"names": ["v1"], "node": "spec.nodeName"}]
    assert pods["OwnPod"]["verbs"] == ["patch"]
    who = token_caller(records)
    own = pod("driver-x7k2p", "gpu-system")
    ready = labels("nvidia.com/gpu.ready")
    assert decide(policy, who, "PATCH", OWN_POD, ready, own) == ALLOWED
    assert decide(policy, who, "PATCH", OWN_POD, labels("app"), own) == 403
    neighbour = "/api/v1/namespaces/gpu-system/pods/neighbour"
    assert decide(policy, who, "PATCH", neighbour, ready, own) != ALLOWED
    assert decide(policy, who, "GET", f"{PODS}?fieldSelector=spec.nodeName%3Dnode-b") != ALLOWED
    elsewhere = pod("job", "default", on="node-b")
    assert decide(policy, who, "GET", "/api/v1/namespaces/default/pods/job", None, elsewhere) == 403


@pytest.mark.parametrize(
    ("read", "rules"),
    [
        # Every pod of the cluster: the list verb as a whole goes to the driver's own RBAC.
        (("list", PODS), {"DriverCredentials": ["list"]}),
        # A pod of another node: the get does, the pinned list stays on the node.
        (("get", "/api/v1/namespaces/default/pods/x", None, pod("x", "default", on="node-b")),
         {"OnNode": ["list"], "DriverCredentials": ["get"]}),
    ],
    ids=["cluster-wide-list", "get-elsewhere"],
)  # fmt: skip
def test_reads_beyond_the_node_are_forwarded_under_the_drivers_own_token(
    read: tuple[Any, ...], rules: dict[str, list[str]]
) -> None:
    text, _ = generated(logged(("list", f"{PODS}?{ON_NODE}"), read))
    assert {rule: entry["verbs"] for rule, entry in entries(text, "pods").items()} == rules
    assert "# REVIEW: forwarded under the driver's own ServiceAccount token" in notes(text)
    assert "`dra-gatekeeper policy rbac --policy <this file>` prints" in notes(text)


def test_a_get_the_log_holds_no_object_of_is_assumed_on_the_node_and_said_so() -> None:
    text, _ = generated(logged(("get", "/api/v1/namespaces/default/pods/job")))
    assert entries(text, "pods")["OnNode"]["verbs"] == ["get"]
    assert "1 get requests assumed to read objects on this node" in notes(text)


def test_the_drivers_namespace_and_its_service_account() -> None:
    event = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "reason": "Started"}
    records = logged(("create", EVENTS, event), ("list", "/api/v1/events"))
    text, policy = generated(records)
    doc = yaml.safe_load(text)
    assert doc["serviceAccounts"] == {GPU: ["gpu-system/gpu-driver"]}
    events = entries(text, "events")
    assert events["DriverNamespace"]["verbs"] == ["create"]
    assert events["DriverCredentials"]["verbs"] == ["list"]  # all namespaces: its own RBAC
    who = token_caller(records)
    assert decide(policy, who, "POST", EVENTS, event) == ALLOWED
    assert decide(policy, who, "POST", "/api/v1/namespaces/kube-system/events", event) != ALLOWED


def test_a_drivers_custom_resource_goes_under_its_own_credentials() -> None:
    status = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "cd", "namespace": "gpu-system"},
        "status": {"ok": True},
    }
    namespaced = "/apis/resource.nvidia.com/v1beta1/namespaces/gpu-system/computedomains"
    text, policy = generated(
        logged(("watch", f"{DOMAINS}?watch=true"), ("update", f"{namespaced}/cd/status", status))
    )  # fmt: skip
    (domains,) = entries(text, "computedomains").values()
    assert (domains["rule"], domains["verbs"]) == ("DriverCredentials", ["update", "watch"])
    assert domains["subresources"] == ["status"]
    socket = Identity(GPU, ListenerKind.UNIX)
    assert decide(policy, socket, "GET", f"{DOMAINS}?watch=true") != ALLOWED  # no token to carry


def taint_rule(driver: str, pool: str, name: str = "r") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {"deviceSelector": {"driver": driver, "pool": pool},
                 "taint": {"key": "k", "effect": "NoExecute"}},
    }  # fmt: skip


def test_device_taint_rules_get_a_cel_scope_from_the_fields_that_held_driver_and_pool() -> None:
    mine = taint_rule(GPU, f"{NODE}/gpus")
    records = logged(("create", RULES, mine, mine), ("get", f"{RULES}/r", None, mine))
    text, policy = generated(records)
    (rules,) = entries(text, "devicetaintrules").values()
    assert rules["rule"] == "CEL" and rules["verbs"] == ["create", "get"]
    assert rules["versions"][0]["scope"] == (
        "object.?spec.?deviceSelector.?driver.orValue('') == variables.driver && "
        "object.?spec.?deviceSelector.?pool.orValue('').startsWith(variables.node + '/')"
    )
    assert "# REVIEW: devicetaintrules.resource.k8s.io v1beta2 (rule CEL): scope proposed" in notes(
        text
    )
    who = token_caller(records)
    assert decide(policy, who, "POST", RULES, mine) == ALLOWED
    empty = {**mine, "spec": {"deviceSelector": {}, "taint": mine["spec"]["taint"]}}
    assert decide(policy, who, "POST", RULES, empty) == 403
    foreign = taint_rule("nic.example.com", f"{NODE}/x")
    assert decide(policy, who, "POST", RULES, foreign) == 403
    assert decide(policy, who, "POST", RULES, taint_rule(GPU, "node-ab/gpus")) != ALLOWED


def test_a_socket_caller_without_a_token_gets_no_credentials_rule() -> None:
    text = generate_policy([record("get", f"{DOMAINS}/cd")], BASE)
    assert "showed no ServiceAccount token to forward them under its own credentials" in notes(text)
    assert "DriverCredentials" not in text.split("apiVersion:")[1]


def test_encodings_are_written_only_where_they_differ_from_the_default() -> None:
    """A built-in kind takes client-go's protobuf by default; the base's wider list is kept."""
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}}
    leases = "/apis/coordination.k8s.io/v1/namespaces/gpu-system/leases"
    text, policy = generated(logged(("create", leases, lease), ("create", SLICES, slice_body())))
    assert "encodings" not in entries(text, "leases")["DriverNamespace"]
    assert policy.kinds["coordination.k8s.io", "leases"].encodings == {"json", "protobuf"}
    assert entries(text, "resourceslices")["NodeLocal"]["encodings"] == ["json", "protobuf", "cbor"]


def test_a_kind_the_log_holds_no_object_of_is_named_and_its_guess_said() -> None:
    lease = "/apis/coordination.k8s.io/v1/namespaces/gpu-system/leases/l"
    text, policy = generated(logged(("get", lease)))
    leases = policy.kind_for("coordination.k8s.io", "leases")
    assert leases is not None and leases.kind == "Lease"
    assert "kind Lease is guessed from the resource name" in notes(text)


def test_requests_of_a_verb_that_fit_no_rule_the_others_fit_are_named() -> None:
    """On a socket (no token to forward), a list of every pod fits no rule: the pinned lists
    still get theirs, and the header names the one left out."""
    records = [record("list", f"{PODS}?{ON_NODE}"), record("list", f"{PODS}?{ON_NODE}"),
               record("list", PODS)]  # fmt: skip
    text, _ = generated(records)
    assert {rule: entry["verbs"] for rule, entry in entries(text, "pods").items()} == {
        "OnNode": ["list"]
    }
    assert (
        f"# NOT ALLOWED: pods v1 list (1 requests seen, e.g. {PODS}): they fit no rule that the "
        "other list requests fit (rule OnNode)"
    ) in notes(text)
