"""Write integrity, purely: body shape, resourceVersion pins, delete preconditions (§4.4)."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.policy import Decision
from gatekeeper.policy.integrity import (
    body_shape,
    pin_delete,
    pin_resource_version,
    pinned_update,
    requested_resource_version,
    stale_conflict,
    stored_resource_version,
)
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request

SLICES = load_policy(None).kinds[("resource.k8s.io", "resourceslices")]
URL = "/apis/resource.k8s.io/v1/resourceslices/s1"
PUT = parse_request("PUT", URL)


def body(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s1", **metadata},
        "spec": {},
    }


STORED = body(resourceVersion="7", uid="u7")

SHAPES = [
    ("ok", body(), None),
    ("not-an-object", [1], "update of resourceslices.resource.k8s.io needs a JSON object body"),
    ("wrong-version", {**body(), "apiVersion": "resource.k8s.io/v1beta1"},
     'body apiVersion/kind "resource.k8s.io/v1beta1"/"ResourceSlice" does not match the URL '
     '("resource.k8s.io/v1"/"ResourceSlice")'),
    ("wrong-kind", {**body(), "kind": "Pod"}, "does not match the URL"),
    ("metadata-not-object", {**body(), "metadata": []}, "metadata must be an object"),
    ("namespace", body(namespace="x"), "the namespace of the provided object does not match"),
    ("other-name", {**body(), "metadata": {"name": "s2"}},
     "the name of the object (s2) does not match the name on the URL (s1)"),
]  # fmt: skip


@pytest.mark.parametrize(("obj", "message"), [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES])
def test_body_shape(obj: Any, message: str | None) -> None:
    refused = body_shape(PUT, SLICES, obj)
    if message is None:
        assert refused is None
    else:
        assert refused is not None and refused.code == 400
        assert message in refused.message


def test_resource_versions_read_from_objects_and_patches() -> None:
    assert stored_resource_version(STORED) == "7"
    assert stored_resource_version({"metadata": []}) == ""
    assert requested_resource_version(body(resourceVersion="3")) == "3"
    assert requested_resource_version([{"op": "add"}]) == ""
    assert requested_resource_version({"metadata": {"resourceVersion": 3}}) == ""


def test_pinning_copies_only_when_it_changes_something() -> None:
    same = body(resourceVersion="7")
    assert pin_resource_version(same, "7") is same
    unpinned = body()
    pinned = pin_resource_version(unpinned, "7")
    assert pinned["metadata"]["resourceVersion"] == "7"
    assert "resourceVersion" not in unpinned["metadata"]


def test_an_update_is_pinned_to_what_was_checked() -> None:
    pinned = pinned_update(PUT, SLICES, body(), STORED)
    assert isinstance(pinned, dict) and pinned["metadata"]["resourceVersion"] == "7"
    stale = pinned_update(PUT, SLICES, body(resourceVersion="6"), STORED)
    assert isinstance(stale, Decision) and stale.code == 409
    assert stale.message == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )
    assert stale_conflict(PUT, SLICES, "", "7") is None
    assert stale_conflict(PUT, SLICES, "7", "7") is None


def test_a_delete_lands_only_on_what_was_checked() -> None:
    delete = parse_request("DELETE", URL)
    allowed = pin_delete(delete, SLICES, {"propagationPolicy": "Foreground"}, STORED)
    assert allowed.allowed
    assert allowed.body == {
        "propagationPolicy": "Foreground",
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"uid": "u7", "resourceVersion": "7"},
    }
    refused = pin_delete(delete, SLICES, {"preconditions": {"uid": "u6"}}, STORED)
    assert refused.code == 409
    assert "Precondition failed: UID in precondition: u6, UID in object meta: u7" in refused.message
    assert pin_delete(delete, SLICES, {"preconditions": "u7"}, STORED).code == 400
