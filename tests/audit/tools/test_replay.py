"""Rebuilding the engine's inputs from a log: method, patch type, stored object, and the basis
each decision rests on."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.audit.tools.replay import ObjectMemory, method_of, patch_type
from gatekeeper.policy.patching import APPLY, JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE
from gatekeeper.policyfile import load_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.testing.harness import GPU, NODE, SLICES, slice_body
from tests.audit.records import record

POLICY = load_policy(None).with_drivers(frozenset({GPU}))
NAME = "node-a-gpu-0"
OBJECT = f"{SLICES}/{NAME}"


@pytest.mark.parametrize(
    ("verb", "method"),
    [("get", "GET"), ("list", "GET"), ("watch", "GET"), ("create", "POST"), ("update", "PUT"),
     ("patch", "PATCH"), ("delete", "DELETE"), ("deletecollection", "DELETE"), ("head", "HEAD")],
)  # fmt: skip
def test_method_of_a_recorded_verb(verb: str, method: str) -> None:
    assert method_of(verb) == method


def test_patch_type_is_recorded_else_inferred() -> None:
    info = parse_request("PATCH", OBJECT)
    applied = parse_request("PATCH", f"{OBJECT}?fieldManager=gpu")
    recorded = record("patch", OBJECT, content_type=STRATEGIC_MERGE)
    assert patch_type(recorded, {}, info) == STRATEGIC_MERGE
    assert patch_type(record("patch", OBJECT), [], info) == JSON_PATCH
    assert patch_type(record("patch", OBJECT), {"apiVersion": "x"}, applied) == APPLY
    assert patch_type(record("patch", OBJECT), {"apiVersion": "x"}, info) == MERGE_PATCH


def stored(rv: str) -> dict[str, Any]:
    obj = slice_body(NAME)
    obj["metadata"].update(resourceVersion=rv, uid="u1")
    return obj


def inputs(memory: ObjectMemory, verb: str, uri: str, **fields: Any) -> Any:
    info = parse_request(method_of(verb), uri)
    rec = record(verb, uri, **fields)
    found = memory.inputs(rec, info, OBJECT if info.name else None, GPU, NODE)
    memory.remember(rec, info)
    return found


def test_the_stored_object_follows_the_log() -> None:
    memory = ObjectMemory(POLICY)
    created = inputs(memory, "create", SLICES, code=201, request_object=slice_body(NAME),
                     response_object=stored("5"))  # fmt: skip
    assert (created.current, created.basis) == (None, "full")
    # What the apiserver stored answers a dry run of the body (one holding a null is decided
    # on such a dry run).
    assert created.proposed == stored("5")
    update = slice_body(NAME)
    updated = inputs(memory, "update", OBJECT, request_object=update)
    assert updated.basis == "full" and updated.current == stored("5")
    deleted = inputs(memory, "delete", OBJECT)  # the update's body is the stored object now
    assert (deleted.current, deleted.basis) == (update, "reconstructed")
    gone = inputs(memory, "get", OBJECT, code=404)
    assert (gone.current, gone.basis) == (None, "full")


def test_an_object_known_only_from_a_request_body_is_reconstructed() -> None:
    memory = ObjectMemory(POLICY)
    inputs(memory, "update", OBJECT, request_object=stored("6"))
    again = inputs(memory, "update", OBJECT, request_object=stored("6"))
    assert (again.current, again.basis) == (stored("6"), "reconstructed")


def test_what_the_log_does_not_hold_is_assumed_the_callers() -> None:
    memory = ObjectMemory(POLICY)
    unseen = inputs(memory, "delete", OBJECT)
    assert unseen.basis == "metadata"
    assert unseen.current["spec"]["driver"] == GPU and unseen.current["spec"]["nodeName"] == NODE
    patched = inputs(memory, "patch", OBJECT, response_object=stored("9"))
    assert patched.body == {} and patched.media_type == MERGE_PATCH
    assert patched.proposed == stored("9")


@pytest.mark.parametrize(
    ("media_type", "body"),
    [(JSON_PATCH, []), (MERGE_PATCH, {}), (STRATEGIC_MERGE, {}), (APPLY, {})],
)
def test_a_patch_without_its_body_changes_nothing_in_its_own_type(
    media_type: str, body: Any
) -> None:
    """A Metadata-level log records a patch's type, not its body: the replay's patch changes
    nothing and is of that type (a JSON patch is a list of operations)."""
    memory = ObjectMemory(POLICY)
    patched = inputs(memory, "patch", OBJECT, content_type=media_type)
    assert (patched.body, patched.media_type, patched.basis) == (body, media_type, "metadata")


def test_a_stored_object_is_aligned_with_the_preconditions_asked() -> None:
    memory = ObjectMemory(POLICY)
    inputs(memory, "get", OBJECT, response_object=stored("5"))
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": "8"}]
    patched = inputs(memory, "patch", OBJECT, request_object=ops, content_type=JSON_PATCH)
    assert patched.current["metadata"]["resourceVersion"] == "8"
