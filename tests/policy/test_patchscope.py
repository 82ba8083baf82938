"""Strategic-merge and apply patches of an own object, read before any dry run
(gatekeeper/policy/patchscope.py): keys and directives that can change a field outside
``mayChange`` are refused by the gatekeeper itself; restating what is stored, as server-side
apply does, still goes to the apiserver's dry run."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gatekeeper.policy.patching import APPLY, STRATEGIC_MERGE
from gatekeeper.rule import Rule
from tests.policy.stored_cases import NODE_PATH, POD_PATH, decide, node, pod

ALLOWED = "gpu.example.com/clique"

# (id, patch, what the refusal names)
REFUSED = [
    # kube-apiserver 1.36.3 panics on this one, even as a dry run: it is never asked.
    ("set-element-order-taints", {"spec": {"$setElementOrder/taints": [{"key": "a"}]}},
     "the directive $setElementOrder/taints at spec can change spec.taints"),
    ("set-element-order-beside-an-allowed-label",
     {"metadata": {"labels": {ALLOWED: "1"}}, "spec": {"$setElementOrder/taints": []}},
     "spec.taints"),
    ("retain-keys-in-metadata", {"metadata": {"$retainKeys": ["labels"]}},
     "the directive $retainKeys at metadata can change metadata"),
    ("patch-replace-metadata", {"metadata": {"$patch": "replace", "labels": {ALLOWED: "1"}}},
     "the directive $patch at metadata"),
    ("delete-from-primitive-list", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}},
     "metadata.finalizers"),
    ("patch-delete-spec", {"spec": {"$patch": "delete"}}, "the directive $patch at spec"),
    ("directive-in-labels", {"metadata": {"labels": {"$patch": "replace", ALLOWED: "1"}}},
     "the directive $patch in metadata.labels"),
    ("label-outside-the-prefix", {"metadata": {"labels": {"example.org/x": "1"}}},
     "metadata.labels[example.org/x] can change"),
    ("labels-null", {"metadata": {"labels": None}},
     "null removes metadata.labels[kubernetes.io/hostname]"),
    ("taints-changed", {"spec": {"taints": []}}, "spec.taints can change"),
    ("unschedulable", {"spec": {"unschedulable": True}}, "spec.unschedulable can change"),
    ("status", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}},
     "status.conditions can change"),
    ("labels-not-a-map", {"metadata": {"labels": ["x"]}}, "metadata.labels is not a map"),
]  # fmt: skip


@pytest.mark.parametrize("media_type", [STRATEGIC_MERGE, APPLY])
@pytest.mark.parametrize(("patch", "named"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_before_any_dry_run(patch: dict[str, Any], named: str, media_type: str) -> None:
    outcome = decide(NODE_PATH, patch, node(), media_type, answer=node())
    decision = outcome.decision
    assert (decision.allowed, decision.code, decision.rule) == (False, 403, Rule.MAY_CHANGE)
    assert named in decision.message, decision.message
    assert decision.message.endswith(
        "a write may change only metadata.labels[gpu.example.com/*], "
        "metadata.annotations[gpu.example.com/*] (policy mayChange)"
    )
    assert not outcome.asked


def restated_node() -> dict[str, Any]:
    """The whole node as read, as server-side apply of an object restates it."""
    applied = copy.deepcopy(node())
    del applied["metadata"]["managedFields"]
    applied["metadata"]["labels"][ALLOWED] = "1"
    return applied


# (id, patch): each is asked of the apiserver, whose result is then decided on.
ASKED = [
    ("kubectl-label", {"metadata": {"labels": {ALLOWED: "1"}}}),
    ("allowed-label-removed", {"metadata": {"labels": {ALLOWED: None}}}),
    ("restated-object", restated_node()),
    ("restated-with-resource-version", {"metadata": {"resourceVersion": "41",
                                                      "labels": {ALLOWED: "1"}}}),
    ("restated-empty-map", {"spec": {}, "metadata": {"labels": {ALLOWED: "2"}}}),
    ("directive-inside-nothing-allowed-is-absent", {"metadata": {"annotations": {ALLOWED: "x"}}}),
    ("null-of-something-absent", {"spec": {"podCIDR": None}}),
]  # fmt: skip


@pytest.mark.parametrize("media_type", [STRATEGIC_MERGE, APPLY])
@pytest.mark.parametrize("patch", [c[1] for c in ASKED], ids=[c[0] for c in ASKED])
def test_honest_patches_go_to_the_dry_run(patch: dict[str, Any], media_type: str) -> None:
    outcome = decide(NODE_PATH, patch, node(), media_type, answer=node(**{ALLOWED: "1"}))
    assert outcome.asked, outcome.decision.message
    assert outcome.decision.allowed


def test_the_dry_run_still_decides_what_the_patch_cannot_show() -> None:
    """An apply that leaves out a field its manager owns removes it: only the apiserver's
    result shows that, and it is decided on."""
    answer = node(**{ALLOWED: "1"})
    answer["spec"]["taints"] = []
    outcome = decide(NODE_PATH, {"metadata": {"labels": {ALLOWED: "1"}}}, node(), APPLY,
                     answer=answer)  # fmt: skip
    assert outcome.asked and outcome.decision.code == 403
    assert "spec.taints changes" in outcome.decision.message


def test_the_own_pod_is_read_the_same_way() -> None:
    refused = decide(POD_PATH, {"metadata": {"labels": {"app": "other"}}}, pod(), STRATEGIC_MERGE)
    assert refused.decision.code == 403 and not refused.asked
    assert "metadata.labels[app] can change" in refused.decision.message
    allowed = decide(POD_PATH, {"metadata": {"labels": {ALLOWED: "a"}}}, pod(), STRATEGIC_MERGE,
                     answer=pod(**{ALLOWED: "a"}))  # fmt: skip
    assert allowed.asked and allowed.decision.allowed
