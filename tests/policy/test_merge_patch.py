"""The merge patch the gatekeeper checks equals the one the apiserver stores (evanphx/json-patch
v4 ``MergePatch``): a table of cases from the library's rules, and the recorded cases 182-185."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gatekeeper.policy.patching import (
    BAD_MERGE_PATCH,
    MERGE_PATCH,
    PatchError,
    merge_patch,
)
from gatekeeper.policy.stored import patched_object
from tests.recorded import recording

# (id, stored, patch, expected)
CASES: list[tuple[str, Any, Any, Any]] = [
    # RFC 7386 appendix A, where the apiserver agrees (object documents and patches).
    ("rfc-replace", {"a": "b"}, {"a": "c"}, {"a": "c"}),
    ("rfc-add", {"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ("rfc-remove", {"a": "b"}, {"a": None}, {}),
    ("rfc-remove-one", {"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ("rfc-list-by-scalar", {"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ("rfc-scalar-by-list", {"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ("rfc-nested", {"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ("rfc-list-replaced", {"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    ("rfc-stored-null-kept", {"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ("rfc-target-not-object", [1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ("rfc-new-nested-null", {}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ("empty-patch", {"a": {"b": [1]}}, {}, {"a": {"b": [1]}}),
    ("null-of-absent-key", {"a": {}}, {"a": {"x": None}}, {"a": {}}),
    (
        "null-at-depth-3",
        {"a": {"b": {"c": 1, "d": 2}}},
        {"a": {"b": {"c": None}}},
        {"a": {"b": {"d": 2}}},
    ),
    # evanphx v4: what replaces a stored list is pruned of null-valued keys, recursively.
    (
        "list-of-objects-with-nulls",
        {"l": [{"a": 1}]},
        {"l": [{"a": None, "b": 2}]},
        {"l": [{"b": 2}]},
    ),
    (
        "nulls-deep-inside-list",
        {"l": [1]},
        {"l": [{"x": {"y": None, "z": [{"w": None, "v": [None, {"u": None}]}]}}]},
        {"l": [{"x": {"z": [{"v": [None, {}]}]}}]},
    ),
    ("null-list-elements-stay", {"l": [1]}, {"l": [None, {"a": None}]}, {"l": [None, {}]}),
    (
        "list-items-are-replaced-not-merged",
        {"l": [{"a": 1, "b": 2}]},
        {"l": [{"a": 3}]},
        {"l": [{"a": 3}]},
    ),
    ("absent-key-new-list", {}, {"l": [{"a": None, "b": [{"c": None}]}]}, {"l": [{"b": [{}]}]}),
    (
        "stored-null-like-absent",
        {"n": None},
        {"n": {"a": None, "b": {"c": None}}},
        {"n": {"b": {}}},
    ),
    ("scalar-replaced-by-object", {"s": 1}, {"s": {"a": None, "b": 1}}, {"s": {"b": 1}}),
    ("string-replaced-by-list", {"s": "x"}, {"s": [{"a": None}]}, {"s": [{}]}),
    # ... but a list or scalar replacing a stored *object* is taken as sent.
    ("list-replacing-object-kept", {"o": {"a": 1}}, {"o": [{"a": None}]}, {"o": [{"a": None}]}),
    ("scalar-replacing-object", {"o": {"a": 1}}, {"o": 5}, {"o": 5}),
    # Inside an object that is merged, new keys are pruned too.
    (
        "merged-object-new-key-pruned",
        {"status": {"x": 1}},
        {"status": {"devices": [{"driver": "d", "data": {"vlan": None, "mtu": 9000}}]}},
        {"status": {"x": 1, "devices": [{"driver": "d", "data": {"mtu": 9000}}]}},
    ),
    (
        "claim-status-echo-with-null",
        {
            "status": {
                "devices": [
                    {"driver": "nic", "conditions": None, "data": {"vlan": None, "mtu": 9000}}
                ]
            }
        },
        {
            "status": {
                "devices": [
                    {"driver": "nic", "data": {"vlan": None, "mtu": 9000}},
                    {"driver": "gpu", "data": {"uuid": "GPU-0000", "ecc": None}},
                ]
            }
        },
        {
            "status": {
                "devices": [
                    {"driver": "nic", "data": {"mtu": 9000}},
                    {"driver": "gpu", "data": {"uuid": "GPU-0000"}},
                ]
            }
        },
    ),
]


@pytest.mark.parametrize(
    ("stored", "patch", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_merge_patch_table(stored: Any, patch: Any, expected: Any) -> None:
    before_stored, before_patch = copy.deepcopy(stored), copy.deepcopy(patch)
    assert merge_patch(stored, patch) == expected
    assert stored == before_stored and patch == before_patch, "inputs are not modified"


def test_result_shares_nothing_with_the_inputs() -> None:
    stored = {"a": {"b": [1]}, "c": {"d": 1}}
    patch = {"c": {"e": [{"f": 1}]}}
    result = merge_patch(stored, patch)
    result["a"]["b"].append(2)
    result["c"]["e"][0]["f"] = 2
    assert stored == {"a": {"b": [1]}, "c": {"d": 1}}
    assert patch == {"c": {"e": [{"f": 1}]}}


@pytest.mark.parametrize(
    "patch", [None, ["c"], "x", 1, True], ids=["null", "list", "str", "int", "bool"]
)
def test_a_merge_patch_that_is_not_an_object_is_400(patch: Any) -> None:
    with pytest.raises(PatchError) as raised:
        merge_patch({"a": "b"}, patch)
    assert raised.value.code == 400 and str(raised.value) == BAD_MERGE_PATCH


def test_rfc7386_would_keep_the_null_the_apiserver_drops() -> None:
    """The difference the recordings show: a plain RFC 7386 merge stores {"vlan": null, "mtu": 9000}
    for a list item; the apiserver stores {"mtu": 9000}."""
    stored = {"status": {"devices": [{"data": {"mtu": 9000}}]}}
    patch = {"status": {"devices": [{"data": {"vlan": None, "mtu": 9000}}]}}
    assert merge_patch(stored, patch)["status"]["devices"] == [{"data": {"mtu": 9000}}]


def test_recorded_claim_status_merge_patch_182() -> None:
    stored = recording(181)["response_body"]
    patch = recording(182)["request_body"]
    served = recording(183)["response_body"]
    result = patched_object(MERGE_PATCH, stored, patch)
    # The apiserver's typed encoding adds "conditions": null to entries without conditions;
    # everything the merge decides (which keys stay, which nulls go) must match.
    expected = [
        {k: v for k, v in entry.items() if not (k == "conditions" and v is None)}
        for entry in served["status"]["devices"]
    ]
    assert result["status"]["devices"] == expected
    assert result["spec"] == served["spec"]
    assert result["status"]["allocation"] == served["status"]["allocation"]


def test_recorded_slice_merge_patch_184() -> None:
    stored = recording(161)["response_body"]
    assert stored["metadata"]["name"] == "rec2-dc-1"
    patch = recording(184)["request_body"]
    served = recording(185)["response_body"]
    assert patched_object(MERGE_PATCH, stored, patch)["spec"] == served["spec"]
