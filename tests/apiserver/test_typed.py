"""The typed effects the embedded API server reproduces (``gatekeeper/apiserver/_typed.py``):
timestamps, ``conditions: null``, RawExtension data kept as sent, the opaque parameters limit,
the decoder's depth limit and numbers no Go type holds (recordings 178-200)."""

from __future__ import annotations

import aiohttp

from gatekeeper.apiserver import APIServer, resource_slice
from tests.apiserver.helpers import CLAIMS, SLICES, call, claim

GROUP = "resource.k8s.io"
ALLOCATION = {
    "devices": {
        "results": [
            {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}
        ]
    }
}


async def test_status_data_is_stored_as_sent_and_conditions_served_null(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    stored = server.add(claim("c1"))
    device = {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}
    body = {
        **stored,
        "status": {"allocation": ALLOCATION, "devices": [device | {"data": {"b": None, "a": 1}}]},
    }
    status, answer = await call(client, "PUT", f"{CLAIMS}/c1/status", body)
    assert status == 200
    entry = answer["status"]["devices"][0]
    assert list(entry) == ["driver", "pool", "device", "conditions", "data"]  # recording 180
    assert entry["conditions"] is None
    assert list(entry["data"].items()) == [("b", None), ("a", 1)]  # nulls and order kept


async def test_timestamps_are_served_as_utc_whole_seconds(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    stored = server.add(claim("c1"))
    created = stored["metadata"]["creationTimestamp"]
    meta = {**stored["metadata"], "creationTimestamp": created.replace("Z", "+00:00")}
    device = {"driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}
    condition = {"type": "Ready", "status": "True", "reason": "R", "message": "m"}
    devices = [
        device | {"conditions": [condition | {"lastTransitionTime": "2026-12-02T21:30:00+00:00"}]},
        device
        | {"device": "gpu-1"}
        | {"conditions": [condition | {"lastTransitionTime": "2026-12-02T23:30:00.5+02:00"}]},
    ]
    body = {**stored, "metadata": meta, "status": {"allocation": ALLOCATION, "devices": devices}}
    status, answer = await call(client, "PUT", f"{CLAIMS}/c1/status", body)
    assert status == 200 and answer["metadata"]["creationTimestamp"] == created
    times = [d["conditions"][0]["lastTransitionTime"] for d in answer["status"]["devices"]]
    assert times == ["2026-12-02T21:30:00Z", "2026-12-02T21:30:00Z"]  # recording 186


def _deep_claim(name: str, levels: int, opener: str) -> bytes:
    """A claim whose opaque parameters nest ``levels`` arrays or objects under ``"a"``."""
    if opener == "[":
        parameters = '{"a":' + "[" * (levels - 1) + "]" * (levels - 1) + "}"
    else:
        parameters = '{"a":' * levels + "{}" + "}" * levels
    config = '[{"requests":["gpu"],"opaque":{"driver":"gpu.example.com","parameters":'
    return (
        '{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"'
        + name
        + '"},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"g"}}],'
        + '"config":'
        + config
        + parameters
        + "}}]}}}"
    ).encode()


async def test_deep_parameters_are_stored_listed_and_deleted(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    status, body = await call(client, "POST", CLAIMS, raw=_deep_claim("deep", 2000, "["))
    assert status == 201, body  # 2,000 levels in 4,004 bytes: under the size limit (191)
    status, listed = await call(client, "GET", CLAIMS)
    assert status == 200 and [i["metadata"]["name"] for i in listed["items"]] == ["deep"]
    status, _ = await call(client, "DELETE", f"{CLAIMS}/deep")
    assert status == 200 and server.objects(GROUP, "resourceclaims") == []


async def test_opaque_parameters_over_10240_bytes_are_422(client: aiohttp.ClientSession) -> None:
    status, body = await call(client, "POST", CLAIMS, raw=_deep_claim("big", 2000, "{"))
    assert (status, body["message"]) == (
        422,
        'ResourceClaim.resource.k8s.io "big" is invalid: spec.devices.config[0].opaque.'
        "parameters: Too long: may not be more than 10240 bytes",
    )
    assert body["details"]["causes"][0]["reason"] == "FieldValueTooLong"


async def test_documents_nesting_more_than_10000_levels_are_400(
    client: aiohttp.ClientSession,
) -> None:
    # The parameters object is level 7 of the document, its arrays 8 on: 7 + 9,994 = 10,001.
    status, body = await call(client, "POST", CLAIMS, raw=_deep_claim("d", 9995, "["))
    assert (status, body["message"]) == (
        400,
        "the object provided is unrecognized (must be of type ResourceClaim): couldn't get "
        "version/kind; json parse error: invalid character '[' exceeded max depth "
        '({"apiVersion":"resource.k8s.io ...)',
    )
    status, body = await call(client, "POST", CLAIMS, raw=_deep_claim("d", 9994, "["))
    assert status == 422  # exactly 10,000 levels decode; then the size limit (recording 195)


async def test_a_number_no_go_type_holds_is_400(client: aiohttp.ClientSession) -> None:
    text = (
        b'{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"big"},'
        b'"spec":{"driver":"gpu.example.com","nodeName":"node-a","pool":{"name":"p",'
        b'"generation":1,"resourceSliceCount":1},"devices":[{"name":"gpu-0","attributes":'
        b'{"index":{"int":1e400}}}]}}'
    )
    status, body = await call(client, "POST", SLICES, raw=text)
    assert (status, body["message"]) == (
        400,
        'ResourceSlice in version "v1" cannot be handled as a ResourceSlice: json: cannot '
        "unmarshal number 1e400 into Go struct field DeviceAttribute.spec.devices.attributes.int "
        "of type int64",
    )


async def test_nodes_are_served_and_a_post_to_a_name_is_405(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    node = server.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
    status, body = await call(client, "GET", "/api/v1/nodes/node-a")
    assert status == 200 and body == node
    slice_ = resource_slice("x", driver="gpu.example.com", node="node-a")
    status, body = await call(client, "POST", f"{SLICES}/x", slice_)
    assert (status, body) == (
        405,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "the server does not allow this method on the requested resource",
            "reason": "MethodNotAllowed",
            "details": {},
            "code": 405,
        },
    )
