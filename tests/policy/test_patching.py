"""Patches, purely: the result a patch would store, and the patch pinned to what was checked."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gatekeeper.policy.patching import (
    APPLY,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE,
    PatchError,
    merge_patch,
    pin_patch,
)
from gatekeeper.policy.stored import patched_object

STORED: dict[str, Any] = {
    "metadata": {"name": "s", "resourceVersion": "7", "labels": {"a": "1"}},
    "spec": {"driver": "gpu", "devices": [{"name": "d0"}]},
}

# RFC 7386 Appendix A, verbatim.
RFC7386 = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]


@pytest.mark.parametrize(("target", "patch", "result"), RFC7386, ids=range(len(RFC7386)))
def test_merge_patch_is_rfc7386(target: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy(target)
    assert merge_patch(target, patch) == result
    assert target == before  # never mutated


# RFC 7386 A's patches that are not objects: the apiserver (evanphx/json-patch v4
# MergePatch) answers 400 "Invalid JSON Patch" instead (tests/policy/test_merge_patch.py
# has the apiserver's own semantics).
NOT_OBJECTS = [
    (["a", "b"], ["c", "d"]),
    ({"a": "b"}, ["c"]),
    ({"a": "foo"}, None),
    ({"a": "foo"}, "bar"),
]


@pytest.mark.parametrize(("target", "patch"), NOT_OBJECTS, ids=range(len(NOT_OBJECTS)))
def test_a_merge_patch_must_be_an_object(target: Any, patch: Any) -> None:
    with pytest.raises(PatchError) as raised:
        merge_patch(target, patch)
    assert raised.value.code == 400


def test_merge_patches_merge() -> None:
    result = patched_object(MERGE_PATCH, STORED, {"metadata": {"labels": {"b": "2"}}})
    assert result["metadata"]["labels"] == {"a": "1", "b": "2"}
    assert STORED["metadata"]["labels"] == {"a": "1"}


def test_json_patch_applies_and_fails_as_the_apiserver_would() -> None:
    ops = [{"op": "replace", "path": "/spec/driver", "value": "nic"}]
    assert patched_object(JSON_PATCH, STORED, ops)["spec"]["driver"] == "nic"
    with pytest.raises(PatchError, match="testing value /spec/driver failed"):
        patched_object(JSON_PATCH, STORED, [{"op": "test", "path": "/spec/driver", "value": "x"}])
    with pytest.raises(PatchError, match="cannot unmarshal"):
        patched_object(JSON_PATCH, STORED, {"op": "add"})
    with pytest.raises(PatchError, match="Unexpected kind: unknown"):
        patched_object(JSON_PATCH, STORED, [{"path": "/spec"}])
    with pytest.raises(PatchError, match="does not leave an object"):
        patched_object(JSON_PATCH, STORED, [{"op": "replace", "path": "", "value": [1]}])
    with pytest.raises(PatchError, match="Invalid JSON Patch"):
        patched_object(MERGE_PATCH, STORED, [1])


def test_labels_and_annotations_are_read_as_go_reads_a_null() -> None:
    """map[string]string in every kind's ObjectMeta: a null value is stored as ""."""
    ops = [
        {"op": "add", "path": "/metadata/labels/z", "value": None},
        {"op": "add", "path": "/metadata/annotations", "value": {"k": None}},
    ]
    result = patched_object(JSON_PATCH, STORED, ops)
    assert result["metadata"]["labels"] == {"a": "1", "z": ""}
    assert result["metadata"]["annotations"] == {"k": ""}


def test_pinning_adds_the_precondition_without_touching_the_patch() -> None:
    json_ops = [{"op": "add", "path": "/metadata/labels/b", "value": "2"}]
    assert pin_patch(JSON_PATCH, json_ops, "7") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
        *json_ops,
    ]
    merge = {"metadata": {"resourceVersion": "3", "labels": {"b": "2"}}}
    assert pin_patch(MERGE_PATCH, merge, "7") == {
        "metadata": {"resourceVersion": "7", "labels": {"b": "2"}}
    }
    assert merge["metadata"]["resourceVersion"] == "3"
    assert pin_patch(APPLY, {"spec": {}}, "7") == {"spec": {}, "metadata": {"resourceVersion": "7"}}
    with pytest.raises(PatchError, match="metadata must be an object"):
        pin_patch(STRATEGIC_MERGE, {"metadata": "x"}, "7")
