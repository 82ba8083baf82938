"""The embedded API server's JSON merge patch (``gatekeeper/apiserver/_merge.py``), table-driven.

Expected results follow evanphx/json-patch ``MergePatch`` (what the apiserver runs for
``application/merge-patch+json``) and, where marked, recordings 159 and 182-185.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gatekeeper.apiserver._merge import merge_patch

CASES: list[tuple[str, Any, Any, Any]] = [
    ("add-key", {"a": 1}, {"b": 2}, {"a": 1, "b": 2}),
    ("replace-scalar", {"a": 1}, {"a": 2}, {"a": 2}),
    ("null-deletes", {"a": 1, "b": 2}, {"a": None}, {"b": 2}),
    ("null-of-absent-key", {"a": 1}, {"z": None}, {"a": 1}),
    ("nested-merge", {"a": {"x": 1, "y": 2}}, {"a": {"y": None, "z": 3}}, {"a": {"x": 1, "z": 3}}),
    ("list-replaces", {"a": [1, 2]}, {"a": [3]}, {"a": [3]}),
    ("object-replaces-scalar", {"a": 1}, {"a": {"b": None, "c": 1}}, {"a": {"c": 1}}),
    ("new-object-pruned-deep", {}, {"a": {"b": {"c": None, "d": 1}}}, {"a": {"b": {"d": 1}}}),
    (
        "recording-182-status-devices",
        {"status": {"devices": [{"device": "nic-0", "data": {"vlan": None, "mtu": 9000}}]}},
        {
            "status": {
                "devices": [
                    {"device": "nic-0", "data": {"vlan": None, "mtu": 9000}},
                    {"device": "gpu-0", "data": {"uuid": "GPU-0000", "ecc": None}},
                ]
            }
        },
        {
            "status": {
                "devices": [
                    {"device": "nic-0", "data": {"mtu": 9000}},
                    {"device": "gpu-0", "data": {"uuid": "GPU-0000"}},
                ]
            }
        },
    ),
    (
        "recording-184-attribute-null-in-list",
        {"spec": {"devices": [{"name": "gpu-0", "attributes": {"model": {"string": "M"}}}]}},
        {"spec": {"devices": [{"name": "gpu-0", "attributes": {"model": None, "i": {"int": 0}}}]}},
        {"spec": {"devices": [{"name": "gpu-0", "attributes": {"i": {"int": 0}}}]}},
    ),
    ("list-into-absent-pruned", {}, {"a": [{"b": None, "c": 1}]}, {"a": [{"c": 1}]}),
    ("list-into-null-pruned", {"a": None}, {"a": [{"b": None}]}, {"a": [{}]}),
    ("null-list-elements-kept", {"a": [1]}, {"a": [None, {"b": None}]}, {"a": [None, {}]}),
    (
        "nested-lists-pruned",
        {"a": []},
        {"a": [[{"b": None, "c": [{"d": None}]}]]},
        {"a": [[{"c": [{}]}]]},
    ),
    # Replacing an object with a non-object keeps the patch value as sent (no pruning).
    ("list-over-object-kept", {"a": {"x": 1}}, {"a": [{"b": None}]}, {"a": [{"b": None}]}),
    ("scalar-over-object", {"a": {"x": 1}}, {"a": "s"}, {"a": "s"}),
    (
        "recording-159-finalizers-null",
        {"metadata": {"finalizers": ["orphan"], "name": "n"}},
        {"metadata": {"finalizers": None}},
        {"metadata": {"name": "n"}},
    ),
    ("empty-patch", {"a": 1}, {}, {"a": 1}),
    ("empty-object-value", {"a": {"x": 1}}, {"a": {}}, {"a": {"x": 1}}),
]


@pytest.mark.parametrize(
    ("document", "patch", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_merge_patch(document: Any, patch: Any, expected: Any) -> None:
    before_doc, before_patch = copy.deepcopy(document), copy.deepcopy(patch)
    assert merge_patch(document, patch) == expected
    assert (document, patch) == (before_doc, before_patch)  # inputs are not modified


def test_a_non_object_patch_replaces_the_document_pruned() -> None:
    assert merge_patch({"a": 1}, [{"b": None}]) == [{}]
    assert merge_patch({"a": 1}, 5) == 5
    assert merge_patch([1], {"a": None, "b": 1}) == {"b": 1}
