"""Node-owned ResourceSlices of ReconcilePoolWithName: no node name, a node selector naming this
node and no other; reads of the driver's own slices on every node (readAcrossNodes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gatekeeper.policy import Engine
from gatekeeper.policy.nodeselector import names_only
from gatekeeper.policyfile import parse_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import decide_offline
from gatekeeper.types import Identity

NODE = "node-a"
GPU = Identity("gpu.example.com", "unix")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
POLICY = parse_policy(
    """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
drivers: [gpu.example.com]
kinds:
  - group: resource.k8s.io
    resource: resourceslices
    kind: ResourceSlice
    scope: Cluster
    rule: NodeLocal
    readAcrossNodes: true
    verbs: [get, list, watch, create, update, delete, deletecollection]
    versions:
      - names: [v1]
        driver: spec.driver
        node: spec.nodeName
        pool: spec.pool.name
        nodeSelector: spec.nodeSelector
        forbidden: [spec.allNodes, spec.perDeviceNodeSelection]
        apiserverImmutable: [driver, node, pool]
""",
    "node-owned.yaml",
)
ENGINE = Engine(POLICY, NODE)


def names(node: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}  # fmt: skip


def node_owned(selector: Any = None, owner: str = NODE, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": GPU.driver,
        "pool": {"name": "node-a/gpus", "generation": 1, "resourceSliceCount": 1},
        "nodeSelector": names(NODE) if selector is None else selector,
        "devices": [],
    }
    if node is not None:
        spec["nodeName"] = node
        del spec["nodeSelector"]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": "s1",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": owner, "uid": "u"}],
        },
        "spec": spec,
    }


HOSTNAME = {"nodeSelectorTerms": [{"matchExpressions": [
    {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}  # fmt: skip
TWO = {"nodeSelectorTerms": [{"matchFields": [
    {"key": "metadata.name", "operator": "In", "values": [NODE, "node-b"]}]}]}  # fmt: skip
NOT_IN = {"nodeSelectorTerms": [{"matchFields": [
    {"key": "metadata.name", "operator": "NotIn", "values": ["node-b"]}]}]}  # fmt: skip
TWO_TERMS = {
    "nodeSelectorTerms": [*names(NODE)["nodeSelectorTerms"], *names("node-b")["nodeSelectorTerms"]]
}


@pytest.mark.parametrize(
    ("selector", "ok"),
    [(names(NODE), True), (names("node-b"), False), (HOSTNAME, False), (TWO, False),
     (NOT_IN, False), (TWO_TERMS, False), ({}, False), (None, False)],
    ids=["this-node", "other-node", "hostname-label", "two-values", "not-in", "two-terms",
         "empty", "null"],
)  # fmt: skip
def test_a_selector_names_this_node_and_no_other(selector: Any, ok: bool) -> None:
    assert names_only(selector, NODE) is ok


def create(body: Any) -> Any:
    return decide_offline(ENGINE, GPU, parse_request("POST", SLICES), body)


def test_a_node_owned_slice_naming_this_node_is_allowed() -> None:
    assert create(node_owned()).allowed
    assert create(node_owned(node=NODE)).allowed  # the node name still works


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (node_owned(HOSTNAME), "spec.nodeSelector must name this node and no other"),
        (node_owned(names("node-b")), "spec.nodeSelector must name this node and no other"),
        (node_owned(owner="node-b"), 'metadata.ownerReferences names Node "node-b"'),
        (node_owned(node="node-b"), 'spec.nodeName "node-b" does not match this node'),
    ],
    ids=["hostname-label", "other-node", "owner-other-node", "node-name-other"],
)
def test_a_node_owned_slice_of_another_node_is_refused(body: Any, why: str) -> None:
    refused = create(body)
    assert not refused.allowed and why in refused.reason


def test_a_list_pins_the_driver_only_and_a_get_reads_another_nodes_own_slice() -> None:
    listed = decide_offline(
        ENGINE, GPU, parse_request("GET", SLICES + "?fieldSelector=spec.driver%3Dgpu.example.com")
    )
    assert listed.forwards
    other = copy.deepcopy(node_owned(names("node-b")))
    other["metadata"].update(resourceVersion="3", uid="u1")
    got = decide_offline(ENGINE, GPU, parse_request("GET", SLICES + "/s1"), None, other)
    assert got.allowed
    theirs = copy.deepcopy(other)
    theirs["spec"]["driver"] = "nic.example.com"
    assert not decide_offline(
        ENGINE, GPU, parse_request("GET", SLICES + "/s1"), None, theirs
    ).allowed
    # ... but writes stay on this node.
    deleted = decide_offline(ENGINE, GPU, parse_request("DELETE", SLICES + "/s1"), None, other)
    assert not deleted.allowed and "must name this node" in deleted.reason


def test_a_deletecollection_still_pins_this_node() -> None:
    info = parse_request("DELETE", SLICES + "?fieldSelector=spec.driver%3Dgpu.example.com")
    refused = decide_offline(ENGINE, GPU, info)
    assert not refused.allowed and "spec.nodeName=node-a" in refused.reason
