"""Ownership of NodeLocal objects: driver, node, node-prefixed pool, node-local only."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from gatekeeper.policy import Field
from gatekeeper.policy.ownership import fill_missing, ownership_violation, pool_name_ok
from gatekeeper.policyfile import load_policy
from gatekeeper.rule import Rule, Violation

NODE, GPU = "node-a", "gpu.example.com"
POLICY = load_policy(None)
SLICES = POLICY.kinds[("resource.k8s.io", "resourceslices")]
POOLS = POLICY.kinds[("devmgmtproto.k8s.io", "devicepools")]
V1 = SLICES.versions["v1"]
POOL_V1 = POOLS.versions["v1alpha1"]


@pytest.mark.parametrize(
    ("pool", "ok"),
    [
        ("node-a", True),
        ("node-a-gpus", False),  # node "node-a-gpus" may exist; "-" is opt-in
        ("node-a/gpus", True),
        ("node-a-", False),
        ("node-a/", False),
        ("node-ab", False),
        ("node-b-gpus", False),
        ("gpus-node-a", False),
        ("", False),
    ],
)
def test_pool_name_is_the_node_or_prefixed_by_it(pool: str, ok: bool) -> None:
    assert pool_name_ok(pool, NODE) is ok


@pytest.mark.parametrize(
    ("pool", "ok"), [("node-a-gpus", True), ("node-a/gpus", True), ("node-a.gpus", False)]
)
def test_a_policy_may_allow_dash(pool: str, ok: bool) -> None:
    assert pool_name_ok(pool, NODE, ("/", "-")) is ok


def slice_v1(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "node-a-gpu"},
        "spec": {"driver": GPU, "nodeName": NODE, "pool": {"name": "node-a/gpus"}},
    }
    body["spec"].update(spec)
    return body


VIOLATIONS = [
    ("own", slice_v1(), False, None),
    ("other-driver", slice_v1(driver="nic"), False, (Rule.DRIVER_MISMATCH,
     'spec.driver "nic" does not match the calling driver "gpu.example.com"')),
    ("no-driver", slice_v1(driver=""), False, (Rule.DRIVER_MISMATCH,
     'spec.driver is empty: it must be the calling driver "gpu.example.com"')),
    ("other-node", slice_v1(nodeName="node-b"), True, (Rule.NODE_MISMATCH,
     'the stored object\'s spec.nodeName "node-b" does not match this node "node-a"')),
    ("odd-node-type", slice_v1(nodeName=7), False, (Rule.NODE_MISMATCH,
     'spec.nodeName "7" does not match this node "node-a"')),
    ("bad-pool", slice_v1(pool={"name": "gpus"}), False, (Rule.POOL_PREFIX,
     'spec.pool.name "gpus" is not prefixed by node name "node-a"')),
    ("no-pool", slice_v1(pool={}), False, (Rule.POOL_PREFIX,
     'spec.pool.name is empty: it must be prefixed by node name "node-a"')),
    ("all-nodes", slice_v1(allNodes=True), False, (Rule.FORBIDDEN_FIELD,
     "spec.allNodes is set: a node-local driver may only publish objects for its own node "
     "(spec.nodeName)")),
    ("all-nodes-false", slice_v1(allNodes=False), False, None),
    ("stored-all-nodes", slice_v1(allNodes=True), True, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("obj", "stored", "problem"), [c[1:] for c in VIOLATIONS], ids=[c[0] for c in VIOLATIONS]
)
def test_ownership_violation_names_the_field_and_the_rule(
    obj: Any, stored: bool, problem: tuple[Rule, str] | None
) -> None:
    expected = None if problem is None else Violation(*problem)
    assert ownership_violation(V1, obj, GPU, NODE, stored=stored) == expected


def test_a_pool_named_by_metadata_name_may_be_generated_where_dash_is_allowed() -> None:
    pool: dict[str, Any] = {"metadata": {"generateName": "node-a-"}, "spec": {}}
    pool["spec"] = {"driver": GPU, "nodeName": NODE}
    dashed = replace(POOL_V1, pool_separators=("/", "-"))
    assert ownership_violation(dashed, pool, GPU, NODE) is None
    # The default: a generated name would be "<node>-<random>", maybe another node's pool.
    assert ownership_violation(POOL_V1, pool, GPU, NODE) == Violation(
        Rule.POOL_PREFIX,
        'metadata.generateName "node-a-" must start with node name "node-a" followed by "/"',
    )
    pool["metadata"]["generateName"] = "gpus-"
    assert ownership_violation(dashed, pool, GPU, NODE) == Violation(
        Rule.POOL_PREFIX,
        'metadata.generateName "gpus-" must start with node name "node-a" followed by "/" or "-"',
    )


def test_fill_missing_sets_only_empty_fields_on_a_copy() -> None:
    kind = replace(SLICES, fill=frozenset({Field.DRIVER, Field.NODE, Field.POOL}))
    empty = {"metadata": {"name": "x"}, "spec": {"pool": {"name": ""}}}
    before = copy.deepcopy(empty)
    filled = fill_missing(kind, V1, empty, GPU, NODE)
    assert filled["spec"] == {"pool": {"name": NODE}, "driver": GPU, "nodeName": NODE}
    assert empty == before
    own = slice_v1()
    assert fill_missing(kind, V1, own, GPU, NODE) is own
    assert fill_missing(SLICES, V1, empty, GPU, NODE) is empty  # the policy fills nothing
    generated = {"metadata": {"generateName": "node-a-"}, "spec": {}}
    pool_kind = replace(POOLS, fill=frozenset({Field.POOL}))
    assert fill_missing(pool_kind, POOL_V1, generated, GPU, NODE) is generated
