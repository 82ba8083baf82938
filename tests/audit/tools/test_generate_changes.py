"""What a write of an own object changed, read from the logged body in each patch type (and an
update against the object the log showed before it), and the ``mayChange`` that opens exactly
that."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.audit.tools.generate._changes import Change, changes_of, may_change_doc
from gatekeeper.policy.model import Changeable
from gatekeeper.testing.harness import NODE

LABELS = ("metadata", "labels")
ANNOTATIONS = ("metadata", "annotations")


@pytest.mark.parametrize(
    ("body", "changes"),
    [
        ({"metadata": {"labels": {"example.com/a": "1", "b": None}}},
         {(LABELS, "example.com/a"), (LABELS, "b")}),
        ({"metadata": {"annotations": {"x.io/y": "z"}, "resourceVersion": "7", "name": NODE}},
         {(ANNOTATIONS, "x.io/y")}),
        ({"spec": {"unschedulable": True, "taints": [{"key": "k"}]}},
         {(("spec", "unschedulable"), None), (("spec", "taints"), None)}),
        ({"metadata": {"labels": None}}, {(LABELS, None)}),
        ({"spec": {"$patch": "replace", "podCIDR": "10.0.0.0/24"}}, {(("spec",), None),
                                                                    (("spec", "podCIDR"), None)}),
        ({"spec": {}}, set()),  # a merge patch of an empty map changes nothing
        # server-side apply: the body names the object; only what it sets is a change
        ({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE,
                                                           "labels": {"example.com/a": "1"}}},
         {(LABELS, "example.com/a")}),
    ],
    ids=["merge-labels", "annotations-and-preconditions", "spec-fields", "all-labels",
         "strategic-directive", "empty", "apply"],
)  # fmt: skip
def test_a_merge_strategic_or_apply_body(body: dict[str, Any], changes: set[Change]) -> None:
    assert changes_of("patch", body, None) == changes


@pytest.mark.parametrize(
    ("operations", "changes"),
    [
        ([{"op": "add", "path": "/metadata/labels/example.com~1zone", "value": "a"}],
         {(LABELS, "example.com/zone")}),
        ([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
          {"op": "remove", "path": "/metadata/annotations/x.io~1y"}],
         {(ANNOTATIONS, "x.io/y")}),
        ([{"op": "replace", "path": "/spec/taints/0/effect", "value": "NoSchedule"}],
         {(("spec", "taints"), None)}),
        ([{"op": "add", "path": "/metadata/labels", "value": {"a": "1", "b": "2"}}],
         {(LABELS, "a"), (LABELS, "b")}),
        ([{"op": "move", "from": "/metadata/labels/a", "path": "/metadata/labels/b"}],
         {(LABELS, "a"), (LABELS, "b")}),
    ],
    ids=["add-escaped-key", "remove-after-test", "list-item", "whole-map", "move"],
)  # fmt: skip
def test_a_json_patch(operations: list[Any], changes: set[Change]) -> None:
    assert changes_of("patch", operations, None) == changes


def test_an_update_against_the_object_before_it_and_without() -> None:
    before = {"metadata": {"name": NODE, "resourceVersion": "1", "labels": {"a": "1", "b": "1"}},
              "spec": {"podCIDR": "10.0.0.0/24"}}  # fmt: skip
    after = {"metadata": {"name": NODE, "resourceVersion": "2", "labels": {"a": "2", "c": "1"}},
             "spec": {"podCIDR": "10.0.0.0/24", "unschedulable": True}}  # fmt: skip
    assert changes_of("update", after, before) == {
        (LABELS, "a"),
        (LABELS, "b"),
        (LABELS, "c"),
        (("spec", "unschedulable"), None),
    }
    assert changes_of("update", after, None) is None  # what it changed, the log cannot show
    assert changes_of("patch", None, None) is None  # no body: Metadata level


def test_may_change_opens_the_narrowest_entries() -> None:
    changes: set[Change] = {
        (LABELS, "example.com/a"),
        (LABELS, "gpu.example.com/b"),
        (("spec",), None),
        (("spec", "unschedulable"), None),  # under spec, which opens whole
        (("metadata",), None),  # never opened: the loader refuses it
    }
    base = [Changeable(LABELS, ("gpu.example.com/*",))]
    assert may_change_doc(changes, base) == [
        {"path": "spec"},
        {"path": "metadata.labels", "keys": ["example.com/a", "gpu.example.com/*"]},
    ]
    assert may_change_doc({(LABELS, None), (LABELS, "a")}) == [{"path": "metadata.labels"}]
