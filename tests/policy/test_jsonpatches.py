"""JSON patches applied as the kube-apiserver 1.36.3 applies them (evanphx/json-patch v4.13.0),
where they are allowed, and bounded as it bounds them: each row's expectation is what the real
apiserver answered (tests/realcluster/test_patch_oracle.py checks the same on it, at scale)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from bench.patch_bench import doubling
from gatekeeper.policy.jsonpatches import MAX_COPY_BYTES, MAX_OPERATIONS, apply_json_patch
from gatekeeper.policy.patching import PatchError

DOC: dict[str, Any] = {
    "metadata": {"name": "n", "labels": {"a": "1"}, "finalizers": ["x", "y"]},
    "spec": {"list": [1, 2, 3], "nothing": None, "obj": {"k": "v"}},
}

# (id, ops, path to read, expected value there): the apiserver's own answers.
APPLIED: list[tuple[str, list[dict[str, Any]], tuple[Any, ...], Any]] = [
    ("add", [{"op": "add", "path": "/metadata/labels/b", "value": "2"}], ("metadata", "labels"),
     {"a": "1", "b": "2"}),
    ("add-null-is-null", [{"op": "add", "path": "/metadata/labels/z", "value": None}],
     ("metadata", "labels", "z"), None),
    ("add-without-value-adds-null", [{"op": "add", "path": "/spec/v"}], ("spec", "v"), None),
    ("add-replaces-member", [{"op": "add", "path": "/metadata/labels/a", "value": "9"}],
     ("metadata", "labels", "a"), "9"),
    ("add-dash-appends", [{"op": "add", "path": "/spec/list/-", "value": 4}], ("spec", "list"),
     [1, 2, 3, 4]),
    ("add-at-length-appends", [{"op": "add", "path": "/spec/list/3", "value": 4}],
     ("spec", "list"), [1, 2, 3, 4]),
    ("add-inserts", [{"op": "add", "path": "/spec/list/0", "value": 0}], ("spec", "list"),
     [0, 1, 2, 3]),
    ("replace-missing-member-adds", [{"op": "replace", "path": "/metadata/labels/z", "value": "v"}],
     ("metadata", "labels"), {"a": "1", "z": "v"}),
    ("replace-root", [{"op": "replace", "path": "", "value": {"kind": "X"}}], ("kind",), "X"),
    ("remove-null-member", [{"op": "remove", "path": "/spec/nothing"}], ("spec",),
     {"list": [1, 2, 3], "obj": {"k": "v"}}),
    ("copy-from-missing-copies-null", [{"op": "copy", "from": "/metadata/nope",
     "path": "/metadata/labels/z"}], ("metadata", "labels", "z"), None),
    ("copy", [{"op": "copy", "from": "/spec/obj", "path": "/spec/obj2"}], ("spec", "obj2"),
     {"k": "v"}),
    ("move", [{"op": "move", "from": "/spec/obj", "path": "/metadata/obj"}], ("metadata", "obj"),
     {"k": "v"}),
    ("move-null-member", [{"op": "move", "from": "/spec/nothing", "path": "/spec/moved"}],
     ("spec", "moved"), None),
    ("test-missing-against-null", [{"op": "test", "path": "/spec/absent", "value": None},
     {"op": "add", "path": "/spec/t", "value": 1}], ("spec", "t"), 1),
    ("test-null-member-without-value", [{"op": "test", "path": "/spec/nothing"},
     {"op": "add", "path": "/spec/t", "value": 1}], ("spec", "t"), 1),
    ("escapes", [{"op": "add", "path": "/metadata/labels/a~1b~0c", "value": "e"}],
     ("metadata", "labels", "a/b~c"), "e"),
    ("escape-one-pass", [{"op": "add", "path": "/metadata/labels/~01", "value": "e"}],
     ("metadata", "labels", "~1"), "e"),
    ("unknown-escape-kept", [{"op": "add", "path": "/metadata/labels/~2", "value": "e"}],
     ("metadata", "labels", "~2"), "e"),
    ("numeric-key-in-a-map", [{"op": "add", "path": "/metadata/labels/0", "value": "n"}],
     ("metadata", "labels", "0"), "n"),
    ("empty-key", [{"op": "add", "path": "/metadata/labels/", "value": "e"}],
     ("metadata", "labels", ""), "e"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("ops", "path", "want"), [c[1:] for c in APPLIED], ids=[c[0] for c in APPLIED]
)
def test_applied_as_the_apiserver_applies_it(
    ops: list[Any], path: tuple[Any, ...], want: Any
) -> None:
    before = copy.deepcopy(DOC)
    patch = copy.deepcopy(ops)
    result: Any = apply_json_patch(DOC, patch)
    for step in path:
        result = result[step]
    assert result == want
    assert before == DOC and patch == ops  # neither input is modified


def test_an_added_value_is_the_patchs_copy() -> None:
    """The forwarded patch is the driver's: a later operation inside an added value changes the
    document only."""
    patch = [
        {"op": "add", "path": "/spec/new", "value": {"k": "v"}},
        {"op": "add", "path": "/spec/new/k2", "value": "v2"},
    ]
    assert apply_json_patch(DOC, patch)["spec"]["new"] == {"k": "v", "k2": "v2"}
    assert patch[0]["value"] == {"k": "v"}


# (id, ops, code, message): refused as the apiserver refuses, or where it reads a form its own way.
REFUSED: list[tuple[str, Any, int, str]] = [
    ("not-a-list", {"op": "add"}, 400, "cannot unmarshal"),
    ("op-not-an-object", [1], 400, "cannot unmarshal"),
    ("unknown-op", [{"op": "merge", "path": "/a"}], 422, "Unexpected kind: merge"),
    ("no-op", [{"path": "/a"}], 422, "Unexpected kind: unknown"),
    ("no-path", [{"op": "add", "value": 1}], 422, "missing path"),
    ("add-to-root", [{"op": "add", "path": "", "value": {}}], 422, "doc is missing path"),
    ("path-without-slash", [{"op": "add", "path": "metadata/labels", "value": {}}], 422,
     'does not start with "/"'),
    ("negative-index", [{"op": "replace", "path": "/spec/list/-1", "value": 0}], 422,
     "not a plain decimal index"),
    ("leading-zero", [{"op": "replace", "path": "/spec/list/01", "value": 0}], 422,
     "not a plain decimal index"),
    ("signed", [{"op": "remove", "path": "/spec/list/+1"}], 422, "not a plain decimal index"),
    ("dash-is-no-element", [{"op": "remove", "path": "/spec/list/-"}], 422, "invalid index"),
    ("past-the-end", [{"op": "add", "path": "/spec/list/4", "value": 0}], 422, "invalid index"),
    ("through-null", [{"op": "add", "path": "/spec/nothing/k", "value": 1}], 422,
     "doc is missing path"),
    ("through-scalar", [{"op": "add", "path": "/metadata/name/k", "value": 1}], 422,
     "doc is missing path"),
    ("through-missing", [{"op": "add", "path": "/status/a/b", "value": 1}], 422,
     "doc is missing path"),
    ("remove-missing", [{"op": "remove", "path": "/metadata/labels/z"}], 422, "nonexistent key"),
    ("move-into-itself", [{"op": "move", "from": "/spec", "path": "/spec/inner"}], 422,
     "doc is missing path"),
    ("test-fails", [{"op": "test", "path": "/metadata/name", "value": "m"}], 422, "failed"),
    ("test-type", [{"op": "test", "path": "/spec/list/0", "value": True}], 422, "failed"),
    ("test-int-float", [{"op": "test", "path": "/spec/list/0", "value": 1.0}], 422, "failed"),
    ("test-missing-against-value", [{"op": "test", "path": "/spec/absent", "value": 1}], 422,
     "failed"),
    ("replace-root-scalar", [{"op": "replace", "path": "", "value": 1}], 422,
     "must be object or array"),
    ("leaves-a-list", [{"op": "replace", "path": "", "value": [1]}], 422,
     "does not leave an object"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("ops", "code", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_refused(ops: Any, code: int, message: str) -> None:
    with pytest.raises(PatchError) as refused:
        apply_json_patch(DOC, ops)
    assert refused.value.code == code
    assert message in str(refused.value)


def test_more_operations_than_the_apiserver_takes_are_refused_before_any_is_applied() -> None:
    ops = [{"op": "remove", "path": "/no/such"}] * (MAX_OPERATIONS + 1)
    with pytest.raises(PatchError) as refused:
        apply_json_patch(DOC, ops)
    assert refused.value.code == 413
    got = MAX_OPERATIONS + 1
    assert str(refused.value) == (
        f"The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {got}"
    )


def test_thirty_doubling_copies_stop_at_the_apiservers_copy_limit() -> None:
    with pytest.raises(PatchError) as refused:
        apply_json_patch(DOC, doubling(30, "/spec/obj"))
    message = str(refused.value)
    assert refused.value.code == 422
    assert message.startswith("Unable to complete the copy, the accumulated size increase of copy")
    assert message.endswith(f"exceeding the limit {MAX_COPY_BYTES}")
    # Refused at the copy that would pass the limit: the document never held more than it.
    copied = int(message.split("copy is ")[1].split(",")[0])
    assert MAX_COPY_BYTES < copied <= 2 * MAX_COPY_BYTES + 1024


def test_copies_within_the_limit_apply() -> None:
    result = apply_json_patch(DOC, doubling(10, "/spec/obj"))
    assert len(json.dumps(result["spec"]["obj"])) > 300 * 2**10


def test_copy_bytes_are_counted_as_go_writes_them() -> None:
    """Go's encoder writes <, > and & as six bytes each: the limit is reached as early as there."""
    value = "<" * (MAX_COPY_BYTES // 6 + 1)
    ops = [{"op": "add", "path": "/spec/h", "value": value}]
    ops.append({"op": "copy", "from": "/spec/h", "path": "/spec/h2"})
    with pytest.raises(PatchError, match="accumulated size increase"):
        apply_json_patch(DOC, ops)


def test_depth_is_bounded() -> None:
    deep: Any = "x"
    for _ in range(99):
        deep = {"a": deep}  # 99 levels, as deep as a request body may go (100 with its root)
    ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/deep", "value": deep}]
    into = "/spec/deep" + "/a" * 98 + "/b"
    ops.append({"op": "copy", "from": "/spec/deep", "path": into})  # 200 levels: the limit
    assert apply_json_patch(DOC, ops)
    ops.append({"op": "add", "path": into + "/a" * 98 + "/z", "value": {}})  # one more
    with pytest.raises(PatchError, match="more than 200 levels deep"):
        apply_json_patch(DOC, ops)


def test_moves_that_nest_without_bound_are_refused_not_crashed() -> None:
    ops: list[dict[str, Any]] = [{"op": "add", "path": "/spec/m", "value": {}}]
    for _ in range(300):
        ops.append({"op": "add", "path": "/spec/n", "value": {}})
        ops.append({"op": "move", "from": "/spec/m", "path": "/spec/n/m"})
        ops.append({"op": "move", "from": "/spec/n", "path": "/spec/m"})
    with pytest.raises(PatchError, match="levels deep"):
        apply_json_patch(DOC, ops)


def test_shifting_large_arrays_is_bounded() -> None:
    big = {"spec": {"list": list(range(200_000))}}
    ops = [{"op": "remove", "path": "/spec/list/0"}] * 100
    with pytest.raises(PatchError, match="shifts more than"):
        apply_json_patch(big, ops)
    assert len(apply_json_patch(big, ops[:10])["spec"]["list"]) == 199_990
