"""The one prediction of what a patch stores (gatekeeper/policy/stored.py): which patches are
decided on the result computed here and which on the apiserver's dry run, what is refused before
any dry run, and the attacks of issue 39 that each of these answers."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bench.patch_bench import doubling
from gatekeeper.policy.patching import APPLY, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE
from gatekeeper.rule import Rule
from tests.policy.stored_cases import (
    NODE_PATH,
    POD_PATH,
    TARGETS,
    decide,
    node,
    pod,
    resource_slice,
    taint_rule,
)

ALLOWED = "gpu.example.com/clique"
SLICE, RULE = TARGETS["slice"][0], TARGETS["taint-rule"][0]


def escaped(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def add(path: str, value: Any) -> dict[str, Any]:
    return {"op": "add", "path": path, "value": value}


# --- issue 39: a null value added any key -------------------------------------------------------

# (id, path, stored, patch, media type, the key the refusal names): each was stored through the
# gatekeeper on kube-apiserver 1.36.3 before (the key with the value "").
NULL_KEYS = [
    ("node-control-plane-label", NODE_PATH, node(),
     [add("/metadata/labels/" + escaped("node-role.kubernetes.io/control-plane"), None)],
     JSON_PATCH, "metadata.labels[node-role.kubernetes.io/control-plane]"),
    ("node-lb-exclusion-beside-an-allowed-label", NODE_PATH, node(),
     [add("/metadata/labels/" + escaped(ALLOWED), "7"),
      add("/metadata/labels/" + escaped("node.kubernetes.io/exclude-from-external-load-balancers"),
          None)],
     JSON_PATCH, "metadata.labels[node.kubernetes.io/exclude-from-external-load-balancers]"),
    ("node-labels-replaced-with-a-null-foreign-key", NODE_PATH, node(),
     [{"op": "replace", "path": "/metadata/labels",
       "value": {"kubernetes.io/hostname": "node-a", ALLOWED: "1", "example.org/x": None}}],
     JSON_PATCH, "metadata.labels[example.org/x]"),
    ("node-annotation", NODE_PATH, node(), [add("/metadata/annotations/other", None)], JSON_PATCH,
     "metadata.annotations[other]"),
    ("pod-label", POD_PATH, pod(), [add("/metadata/labels/tier", None)], JSON_PATCH,
     "metadata.labels[tier]"),
    ("pod-annotation", POD_PATH, pod(), [add("/metadata/annotations", {"x": None})], JSON_PATCH,
     "metadata.annotations changes"),
    ("copy-from-a-missing-key", NODE_PATH, node(),
     [{"op": "copy", "from": "/metadata/nope", "path": "/metadata/labels/x"}], JSON_PATCH,
     "metadata.labels[x]"),
    ("merge-patch-null-inside-a-new-list", NODE_PATH, node(),
     {"metadata": {"finalizers": [None]}}, MERGE_PATCH, "metadata.finalizers changes"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "stored", "patch", "media_type", "key"),
    [c[1:] for c in NULL_KEYS],
    ids=[c[0] for c in NULL_KEYS],
)
def test_a_null_value_is_a_change_refused_before_any_dry_run(
    path: str, stored: Any, patch: Any, media_type: str, key: str
) -> None:
    outcome = decide(path, patch, stored, media_type)
    decision = outcome.decision
    assert (decision.allowed, decision.code, decision.rule) == (False, 403, Rule.MAY_CHANGE)
    assert key in decision.message, decision.message
    assert not outcome.asked


def test_a_null_under_an_allowed_key_is_stored_as_go_stores_it() -> None:
    """Labels are map[string]string in every kind: a null is "", decided here, not asked."""
    patch = [add("/metadata/labels/" + escaped(ALLOWED), None)]
    outcome = decide(NODE_PATH, patch, node(), JSON_PATCH)
    assert outcome.decision.allowed and not outcome.asked
    assert outcome.decision.body == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
        *patch,
    ]


def test_a_merge_patch_null_deletes_what_it_names() -> None:
    outcome = decide(NODE_PATH, {"metadata": {"labels": {ALLOWED: None}}}, node(**{ALLOWED: "1"}),
                     MERGE_PATCH)  # fmt: skip
    assert outcome.decision.allowed and not outcome.asked
    removing_another = {"metadata": {"labels": {"kubernetes.io/hostname": None}}}
    refused = decide(NODE_PATH, removing_another, node(), MERGE_PATCH).decision
    assert refused.code == 403 and "metadata.labels[kubernetes.io/hostname]" in refused.message


# --- the choice: computed here, or the apiserver's dry run ---------------------------------------


def test_a_patch_whose_fields_are_read_exactly_is_decided_here() -> None:
    patch = [add("/spec/devices/-", {"name": "gpu-1"})]
    outcome = decide(SLICE, patch, resource_slice(), JSON_PATCH)
    assert outcome.decision.allowed and not outcome.asked


@pytest.mark.parametrize(
    ("patch", "media_type"),
    [
        ([add("/spec/devices/0/attributes", {"model": None})], JSON_PATCH),
        ({"spec": {"devices": [{"name": "gpu-0", "attributes": {"m": {"string": None}}}, None]}},
         MERGE_PATCH),
    ],
    ids=["json-patch", "merge-patch-list"],
)  # fmt: skip
def test_a_null_left_in_the_result_is_decided_on_the_dry_run(patch: Any, media_type: str) -> None:
    """Go stores a null by its field's type, which only the apiserver knows."""
    path = SLICE
    answer = resource_slice()
    outcome = decide(path, patch, resource_slice(), media_type, answer=answer)
    assert outcome.asked and outcome.decision.allowed
    assert outcome.previews[0].body == outcome.decision.body  # the one pinned patch
    foreign = resource_slice(driver="nic.example.com")
    refused = decide(path, patch, resource_slice(), media_type, answer=foreign).decision
    assert refused.code == 403 and "spec.driver" in refused.message


@pytest.mark.parametrize("media_type", [JSON_PATCH, MERGE_PATCH])
def test_a_patch_cel_reads_is_decided_on_the_apiservers_result(media_type: str) -> None:
    patch: Any = (
        [{"op": "replace", "path": "/spec/taint/effect", "value": "NoExecute"}]
        if media_type == JSON_PATCH
        else {"spec": {"taint": {"effect": "NoExecute"}}}
    )
    path = RULE
    outcome = decide(path, patch, taint_rule(), media_type, answer=taint_rule())
    assert outcome.asked and outcome.decision.allowed
    # The scope holds on the local result; the apiserver's answer is what is decided on.
    taken = decide(path, patch, taint_rule(), media_type, answer=taint_rule(pool="node-b/gpus"))
    assert not taken.decision.allowed and taken.decision.rule is Rule.CEL_VALIDATION


def test_a_rejected_dry_run_is_the_answer() -> None:
    path = RULE
    invalid = {"kind": "Status", "code": 422, "message": "spec.taint.effect: Unsupported value"}
    outcome = decide(path, {"spec": {"taint": {"effect": "Bad"}}}, taint_rule(), MERGE_PATCH,
                     answer=invalid, code=422)  # fmt: skip
    decision = outcome.decision
    assert (decision.allowed, decision.code, decision.response) == (True, 422, invalid)
    assert not decision.forwards


def test_what_the_local_result_refuses_is_refused_before_the_dry_run() -> None:
    patch = [add("/spec/devices/0/attributes", {"model": None}),
             {"op": "replace", "path": "/spec/driver", "value": "nic.example.com"}]  # fmt: skip
    outcome = decide(SLICE, patch, resource_slice(), JSON_PATCH)
    assert outcome.decision.code == 403 and not outcome.asked
    assert "after the patch, spec.driver" in outcome.decision.message


# --- fields only the apiserver maintains --------------------------------------------------------

FORGED = [{"manager": "kubelet", "operation": "Apply", "apiVersion": "v1",
           "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:taints": {}}}}]  # fmt: skip

# (id, path, stored, patch, media type)
MANAGED_FIELDS = [
    ("merge-forged", NODE_PATH, node(), {"metadata": {"managedFields": FORGED}}, MERGE_PATCH),
    ("merge-cleared", NODE_PATH, node(), {"metadata": {"managedFields": []}}, MERGE_PATCH),
    ("json-forged", NODE_PATH, node(), [add("/metadata/managedFields/-", FORGED[0])], JSON_PATCH),
    ("json-entry-renamed", NODE_PATH, node(),
     [{"op": "replace", "path": "/metadata/managedFields/0/manager", "value": "x"}], JSON_PATCH),
    ("strategic-forged", NODE_PATH, node(), {"metadata": {"managedFields": FORGED}},
     STRATEGIC_MERGE),
    ("slice-merge-forged", SLICE, resource_slice(),
     {"metadata": {"managedFields": FORGED}}, MERGE_PATCH),
    ("cel-kind-json-forged", RULE, taint_rule(),
     [add("/metadata/managedFields", FORGED)], JSON_PATCH),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "stored", "patch", "media_type"),
    [c[1:] for c in MANAGED_FIELDS],
    ids=[c[0] for c in MANAGED_FIELDS],
)
def test_managed_fields_are_no_drivers_to_write(
    path: str, stored: Any, patch: Any, media_type: str
) -> None:
    outcome = decide(path, patch, stored, media_type)
    decision = outcome.decision
    assert (decision.allowed, decision.code, decision.rule) == (False, 403, Rule.FORBIDDEN_FIELD)
    assert "metadata.managedFields is maintained by the apiserver" in decision.message
    assert not outcome.asked


@pytest.mark.parametrize(
    "managed",
    [None, "restated", "restated-python-time"],
    ids=["null", "restated", "restated-python-time"],
)
def test_managed_fields_left_or_restated_pass(managed: Any) -> None:
    stored = node()
    value = copy.deepcopy(stored["metadata"]["managedFields"]) if managed else None
    if managed == "restated-python-time":
        value[0]["time"] = "2026-12-01T10:00:00+00:00"  # the official Python client's spelling
    patch = {"metadata": {"managedFields": value, "labels": {ALLOWED: "1"}}}
    assert decide(NODE_PATH, patch, stored, MERGE_PATCH).decision.allowed


def test_an_update_restates_managed_fields_or_is_refused() -> None:
    stored = node()
    body = copy.deepcopy(stored)
    body["metadata"]["labels"][ALLOWED] = "1"
    assert decide(NODE_PATH, body, stored, "application/json", method="PUT").decision.allowed
    body["metadata"]["managedFields"] = FORGED
    refused = decide(NODE_PATH, body, stored, "application/json", method="PUT").decision
    assert refused.code == 403 and refused.rule is Rule.FORBIDDEN_FIELD


@pytest.mark.parametrize(("field", "value"), [("managedFields", FORGED), ("generation", 7)])
def test_a_create_may_not_set_what_the_apiserver_would_keep(field: str, value: Any) -> None:
    body = resource_slice()
    del body["metadata"]["resourceVersion"], body["metadata"]["managedFields"]
    body["metadata"][field] = value
    outcome = decide("/apis/resource.k8s.io/v1/resourceslices", body, None, "application/json",
                     method="POST")  # fmt: skip
    assert outcome.decision.code == 403 and f"metadata.{field} is maintained" in (
        outcome.decision.message
    )
    body["metadata"][field] = None
    assert decide("/apis/resource.k8s.io/v1/resourceslices", body, None, "application/json",
                  method="POST").decision.allowed  # fmt: skip


@pytest.mark.parametrize(
    "patch",
    [{"metadata": {"uid": "other"}}, {"metadata": {"creationTimestamp": "2020-01-01T00:00:00Z"}},
     {"metadata": {"generation": 9}}],
    ids=["uid", "creation-time", "generation"],
)  # fmt: skip
def test_fields_the_apiserver_resets_are_not_compared(patch: dict[str, Any]) -> None:
    """The apiserver keeps the stored uid (422 for another), creation time and generation of an
    update: no driver's change, whatever the patch says (checked on the real tier)."""
    assert decide(NODE_PATH, patch, node(), MERGE_PATCH).decision.allowed


# --- item 0: no patch costs the gatekeeper more than it costs the apiserver ---------------------


@pytest.mark.parametrize("path", [NODE_PATH, RULE])
def test_thirty_doubling_copies_are_refused_at_the_apiservers_limit(path: str) -> None:
    stored = node() if path == NODE_PATH else taint_rule()
    under = "/metadata/annotations" if path == NODE_PATH else "/spec/taint"
    outcome = decide(path, doubling(30, under), stored, JSON_PATCH)
    assert outcome.decision.code == 422 and not outcome.asked
    assert "accumulated size increase of copy" in outcome.decision.message


def test_too_many_operations_are_413_with_the_pin_counted() -> None:
    """The forwarded patch carries the resourceVersion test: 9,999 of the driver's fit."""
    ops = [{"op": "test", "path": "/kind", "value": "Node"}]
    assert decide(NODE_PATH, ops * 9_999, node(), JSON_PATCH).decision.allowed
    refused = decide(NODE_PATH, ops * 10_000, node(), JSON_PATCH).decision
    assert refused.code == 413 and "got 10001" in refused.message


@pytest.mark.parametrize("media_type", [STRATEGIC_MERGE, APPLY, JSON_PATCH, MERGE_PATCH])
def test_the_forwarded_patch_is_the_pinned_one_asked(media_type: str) -> None:
    patch: Any = (
        [add("/metadata/labels/" + escaped(ALLOWED), "1")]
        if media_type == JSON_PATCH
        else {"metadata": {"labels": {ALLOWED: "1"}}}
    )
    answered = node(**{ALLOWED: "1"})
    outcome = decide(NODE_PATH, patch, node(), media_type, answer=answered)
    assert outcome.decision.allowed
    assert outcome.asked is (media_type in (STRATEGIC_MERGE, APPLY))
    if outcome.asked:
        assert outcome.previews[0].body == outcome.decision.body
