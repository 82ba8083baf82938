"""Field ownership and server-side apply (``gatekeeper/apiserver/_managed.py``), over HTTP as
recordings 167-177 show them, and kubectl's apply against the embedded API server."""

from __future__ import annotations

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer, resource_slice
from tests.apiserver.helpers import APPLY, MERGE, SLICES, call

GROUP, RESOURCE = "resource.k8s.io", "resourceslices"


def _slice(name: str, model: str = "M1") -> dict:
    devices = [{"name": "gpu-0", "attributes": {"model": {"string": model}}}]
    obj = resource_slice(name, driver="gpu.example.com", node="node-a", devices=devices)
    obj["metadata"]["labels"] = {"test": "ssa"}
    return obj


def _managers(obj: dict) -> list[tuple[str, str]]:
    return [(e["manager"], e["operation"]) for e in obj["metadata"].get("managedFields", [])]


async def test_apply_creates_then_updates_as_one_manager(client: aiohttp.ClientSession) -> None:
    config = _slice("s1")
    config["metadata"]["resourceVersion"] = "12345"  # ignored on create (recording 174)
    status, body = await call(client, "PATCH", f"{SLICES}/s1?fieldManager=kubectl", config, APPLY)
    assert status == 201 and _managers(body) == [("kubectl", "Apply")]
    fields = body["metadata"]["managedFields"][0]["fieldsV1"]
    assert fields["f:metadata"] == {"f:labels": {"f:test": {}}}  # no "." for Apply
    assert set(fields["f:spec"]) == {"f:devices", "f:driver", "f:nodeName", "f:pool"}
    status, body = await call(
        client, "PATCH", f"{SLICES}/s1?fieldManager=kubectl", _slice("s1", "M2"), APPLY
    )
    assert status == 200 and body["metadata"]["generation"] == 2
    assert body["spec"]["devices"][0]["attributes"]["model"] == {"string": "M2"}
    assert _managers(body) == [("kubectl", "Apply")]


async def test_an_apply_over_an_update_managers_value_conflicts(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    status, body = await call(client, "POST", f"{SLICES}?fieldManager=kubectl", _slice("s2"))
    assert status == 201 and _managers(body) == [("kubectl", "Update")]
    assert body["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"] == {
        "f:labels": {".": {}, "f:test": {}}
    }
    status, body = await call(
        client, "PATCH", f"{SLICES}/s2?fieldManager=kubectl", _slice("s2", "M2"), APPLY
    )
    assert (status, body["reason"], body["message"]) == (
        409,
        "Conflict",
        'Apply failed with 1 conflict: conflict with "kubectl" using resource.k8s.io/v1: '
        ".spec.devices",
    )
    assert body["details"] == {
        "causes": [
            {
                "reason": "FieldManagerConflict",
                "message": 'conflict with "kubectl" using resource.k8s.io/v1',
                "field": ".spec.devices",
            }
        ]
    }
    assert server.get(GROUP, RESOURCE, "s2")["spec"]["devices"][0]["attributes"]["model"] == {
        "string": "M1"
    }
    # The same values are shared, not a conflict; another value by another manager is fine.
    status, body = await call(
        client, "PATCH", f"{SLICES}/s2?fieldManager=kubectl", _slice("s2"), APPLY
    )
    # The apiserver lists Apply entries before Update ones (sortEncodedManagedFields).
    assert status == 200 and _managers(body) == [("kubectl", "Apply"), ("kubectl", "Update")]


async def test_an_update_takes_the_fields_it_changes(client: aiohttp.ClientSession) -> None:
    await call(client, "PATCH", f"{SLICES}/s3?fieldManager=a", _slice("s3"), APPLY)
    patch = {"spec": {"devices": [{"name": "gpu-0"}]}}
    status, body = await call(client, "PATCH", f"{SLICES}/s3?fieldManager=b", patch, MERGE)
    assert status == 200 and _managers(body) == [("a", "Apply"), ("b", "Update")]
    owned = {e["manager"]: e["fieldsV1"] for e in body["metadata"]["managedFields"]}
    assert "f:devices" not in owned["a"]["f:spec"] and owned["b"] == {"f:spec": {"f:devices": {}}}
    # Manager "a" applying its old devices now conflicts with "b".
    status, body = await call(client, "PATCH", f"{SLICES}/s3?fieldManager=a", _slice("s3"), APPLY)
    assert status == 409 and 'conflict with "b" using resource.k8s.io/v1' in body["message"]


async def test_an_apply_removes_what_its_manager_no_longer_applies(
    client: aiohttp.ClientSession,
) -> None:
    config = _slice("s4")
    config["metadata"]["labels"] = {"test": "ssa", "extra": "x"}
    await call(client, "PATCH", f"{SLICES}/s4?fieldManager=a", config, APPLY)
    status, body = await call(client, "PATCH", f"{SLICES}/s4?fieldManager=a", _slice("s4"), APPLY)
    assert status == 200 and body["metadata"]["labels"] == {"test": "ssa"}


@pytest.mark.parametrize(
    ("path", "value"),
    [(("driver",), "nic.example.com"), (("nodeName",), "node-b"), (("pool", "name"), "other")],
    ids=["driver", "nodeName", "pool.name"],
)
async def test_immutable_fields_on_apply_update_and_patch(
    client: aiohttp.ClientSession, server: APIServer, path: tuple[str, ...], value: str
) -> None:
    server.add(_slice("s5"))
    await call(client, "PATCH", f"{SLICES}/s5?fieldManager=kubectl", _slice("s5"), APPLY)
    changed = _slice("s5")
    target = changed["spec"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    field = "spec." + ".".join(path)
    stored = server.get(GROUP, RESOURCE, "s5")
    put = {**stored, "spec": changed["spec"]}
    merge = {"spec": changed["spec"]}
    for method, body, headers in (
        ("PATCH", changed, APPLY),
        ("PUT", put, None),
        ("PATCH", merge, MERGE),
    ):
        status, answer = await call(
            client, method, f"{SLICES}/s5?fieldManager=kubectl", body, headers
        )
        assert (status, answer["message"]) == (
            422,
            f'ResourceSlice.resource.k8s.io "s5" is invalid: {field}: Invalid value: '
            f'"{value}": field is immutable',
        ), method
    assert server.get(GROUP, RESOURCE, "s5") == stored
