"""Write integrity (DESIGN §4.4): decide on the object that will be stored, and pin the decision.

Real drivers over the Unix socket, the embedded API server upstream; every refusal is checked
against the upstream's journal, and the race tests flip ownership between fetch and forward.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PKI,
    SLICES,
    InterleavedUpstream,
    Running,
    raw_request,
    running_gatekeeper,
    seed,
    slice_body,
)
from gatekeeper.upstream.kubeconfig import UpstreamConfig

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
NAME = "node-a-gpu-0"


def writes(apiserver: APIServer) -> list[tuple[str, str, str]]:
    """Requests that could change state: everything but reads and dry runs."""
    return [
        (e.method, e.path, e.query_string)
        for e in apiserver.journal
        if e.method != "GET" and "dryRun=All" not in e.query_string
    ]


def patch_for(media_type: str, change: dict[str, Any]) -> Any:
    """The same change, ``{"spec": {...}}``, in each patch language."""
    if media_type == JSON_PATCH:
        return [
            {"op": "add", "path": f"/spec/{key}", "value": value}
            for key, value in change["spec"].items()
        ]
    if media_type == APPLY:
        body = slice_body(name=NAME)
        body["spec"].update(change["spec"])
        return body
    return change


async def send_patch(
    running: Running, media_type: str, patch: Any, name: str = NAME, query: str = ""
):
    async with running.unix_session(GPU) as session:
        response = await session.patch(
            f"{SLICES}/{name}{query}", data=json.dumps(patch), headers={"Content-Type": media_type}
        )
        return response.status, await response.json()


APPLY_QUERY = "?fieldManager=gpu-driver&force=true"
PATCH_TYPES = [
    pytest.param(MERGE, "", id="merge"),
    pytest.param(JSON_PATCH, "", id="json"),
    pytest.param(STRATEGIC, "", id="strategic"),
    pytest.param(APPLY, APPLY_QUERY, id="apply"),
]


@pytest.mark.parametrize(("media_type", "query"), PATCH_TYPES)
async def test_allowed_patch_lands_pinned(
    gatekeeper: Running, apiserver: APIServer, media_type: str, query: str
) -> None:
    stored = seed(apiserver, name=NAME)
    change = {"spec": {"devices": [{"name": "gpu-0"}, {"name": "gpu-1"}]}}
    status, body = await send_patch(
        gatekeeper, media_type, patch_for(media_type, change), query=query
    )
    assert status == 200, body
    assert [d["name"] for d in body["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    real = [e for e in apiserver.journal if e.method == "PATCH" and "dryRun" not in e.query_string]
    assert len(real) == 1
    forwarded = json.loads(real[0].body)
    rv = stored["metadata"]["resourceVersion"]
    if media_type == JSON_PATCH:
        assert forwarded[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": rv}
    else:
        assert forwarded["metadata"]["resourceVersion"] == rv


MOVES = [
    pytest.param(
        {"spec": {"pool": {"name": "other-gpus"}}}, "is not prefixed by node name", id="pool"
    ),
    pytest.param({"spec": {"nodeName": "node-b"}}, "does not match this node", id="node"),
    pytest.param({"spec": {"driver": NIC}}, "does not match the calling driver", id="driver"),
    pytest.param({"spec": {"allNodes": True}}, "spec.allNodes is set", id="all-nodes"),
]


@pytest.mark.parametrize(("media_type", "query"), PATCH_TYPES)
@pytest.mark.parametrize(("change", "message"), MOVES)
async def test_patch_that_moves_the_object_is_refused(
    gatekeeper: Running,
    apiserver: APIServer,
    media_type: str,
    query: str,
    change: dict[str, Any],
    message: str,
) -> None:
    seed(apiserver, name=NAME)
    status, body = await send_patch(
        gatekeeper, media_type, patch_for(media_type, change), query=query
    )
    if status == 422:
        # The apiserver's dry run already refuses immutable fields (driver, nodeName).
        assert media_type in (STRATEGIC, APPLY) and "immutable" in body["message"]
    else:
        assert status == 403, body
        assert "after the patch" in body["message"] and message in body["message"]
    assert writes(apiserver) == []
    assert apiserver.get("resource.k8s.io", "resourceslices", NAME)["spec"]["nodeName"] == NODE


@pytest.mark.parametrize(("media_type", "query"), PATCH_TYPES)
async def test_patch_of_a_foreign_object_is_refused(
    gatekeeper: Running, apiserver: APIServer, media_type: str, query: str
) -> None:
    seed(apiserver, name=NAME, driver=NIC)
    change = {"spec": {"devices": []}}
    status, body = await send_patch(
        gatekeeper, media_type, patch_for(media_type, change), query=query
    )
    assert status == 403 and "the stored object's spec.driver" in body["message"]
    assert writes(apiserver) == []
    assert [e.method for e in apiserver.journal] == ["GET"]


async def test_patch_with_another_resource_version_is_a_conflict(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    stale = str(int(seed(apiserver, name=NAME)["metadata"]["resourceVersion"]) + 1000)
    status, body = await send_patch(gatekeeper, MERGE, {"metadata": {"resourceVersion": stale}})
    assert status == 409 and "the object has been modified" in body["message"]
    assert writes(apiserver) == []


async def test_failed_json_patch_is_422_without_forwarding(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    seed(apiserver, name=NAME)
    patch = [{"op": "test", "path": "/spec/driver", "value": "someone-else"}]
    status, body = await send_patch(gatekeeper, JSON_PATCH, patch)
    assert status == 422 and body["reason"] == "Invalid"
    assert writes(apiserver) == []


async def test_apply_on_a_missing_slice_is_forwarded_as_the_apply(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """ResourceSlice driver, node and pool are immutable (policy ``immutable``): the apply is
    forwarded as sent, so its fields belong to an Apply manager. A kind
    without that guarantee gets a create: tests/proxy/test_recorded_parity.py."""
    status, body = await send_patch(gatekeeper, APPLY, slice_body(name=NAME), query=APPLY_QUERY)
    assert status == 201, body
    assert writes(apiserver) == [("PATCH", f"{SLICES}/{NAME}", APPLY_QUERY[1:])]
    status, body = await send_patch(
        gatekeeper,
        APPLY,
        slice_body(name="node-a-nic-0", driver=NIC),
        name="node-a-nic-0",
        query=APPLY_QUERY,
    )
    assert status == 403 and "does not match the calling driver" in body["message"]
    assert len(writes(apiserver)) == 1


async def test_apply_create_cannot_land_on_an_object_created_in_between(
    apiserver: APIServer, policy: Any, pki: PKI
) -> None:
    """Someone else creates the name between the gatekeeper's fetch (404) and its forward."""

    config = UpstreamConfig(server=apiserver.url, token=NODE_TOKEN)
    upstream = InterleavedUpstream(
        config, after_read=lambda path: seed(apiserver, name=NAME, driver=NIC)
    )
    async with running_gatekeeper(apiserver, policy, pki, upstream=upstream) as running:
        status, body = await send_patch(running, APPLY, slice_body(name=NAME), query=APPLY_QUERY)
    # The apply lands on the other driver's slice; the apiserver refuses to change its driver.
    assert status == 422 and body["reason"] == "Invalid", body
    assert "spec.driver: Invalid value" in body["message"] and "immutable" in body["message"]
    assert apiserver.get("resource.k8s.io", "resourceslices", NAME)["spec"]["driver"] == NIC


async def test_update_that_moves_the_object_is_refused(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    seed(apiserver, name=NAME)
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.put(f"{SLICES}/{NAME}", json=slice_body(name=NAME, node="node-b"))
        assert response.status == 403
    assert writes(apiserver) == []


async def test_delete_merges_client_preconditions(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    stored = seed(apiserver, name=NAME)
    async with gatekeeper.unix_session(GPU) as session:
        refused = await session.delete(
            f"{SLICES}/{NAME}", json={"preconditions": {"resourceVersion": "999999"}}
        )
        assert refused.status == 409
        assert writes(apiserver) == []
        allowed = await session.delete(
            f"{SLICES}/{NAME}",
            json={
                "propagationPolicy": "Background",
                "preconditions": {"uid": stored["metadata"]["uid"]},
            },
        )
        assert allowed.status == 200
    options = json.loads(next(e for e in apiserver.journal if e.method == "DELETE").body)
    assert options["propagationPolicy"] == "Background"
    assert options["preconditions"] == {
        "uid": stored["metadata"]["uid"],
        "resourceVersion": stored["metadata"]["resourceVersion"],
    }


async def test_dry_run_is_checked_like_a_real_write(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    async with gatekeeper.unix_session(GPU) as session:
        refused = await session.post(f"{SLICES}?dryRun=All", json=slice_body(driver=NIC))
        assert refused.status == 403
        allowed = await session.post(f"{SLICES}?dryRun=All", json=slice_body())
        assert allowed.status == 201
    assert apiserver.objects("resource.k8s.io", "resourceslices") == []


BODIES = [
    (
        # A custom resource's endpoint cannot read protobuf: refused before anything is asked.
        "protobuf-custom-resource",
        "POST",
        "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools",
        b"\x6b\x38\x73\x00",
        "application/vnd.kubernetes.protobuf",
        415,
    ),
    ("cbor-update", "PUT", f"{SLICES}/{NAME}", b"\xd9\xd9\xf7\xa0", "application/cbor", 415),
    ("yaml-create", "POST", SLICES, b"kind: ResourceSlice", "application/yaml", 415),
    ("json-on-patch", "PATCH", f"{SLICES}/{NAME}", b"{}", "application/json", 415),
    (
        "duplicate-key",
        "POST",
        SLICES,
        b'{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","spec":{"driver":"gpu.example.com",'
        b'"driver":"nic.example.com"}}',
        "application/json",
        400,
    ),
    (
        "case-colliding-keys",
        "POST",
        SLICES,
        b'{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","spec":{"driver":"gpu.example.com",'
        b'"Driver":"nic.example.com"}}',
        "application/json",
        400,
    ),
    (
        "yaml-apply-duplicate",
        "PATCH",
        f"{SLICES}/{NAME}?fieldManager=x",
        b"spec:\n  driver: a\n  driver: b\n",
        APPLY,
        400,
    ),
    ("not-json", "POST", SLICES, b"{nope", "application/json", 400),
    ("array-create", "POST", SLICES, b"[]", "application/json", 400),
    (
        "too-large",
        "POST",
        SLICES,
        b"{" + b" " * (3 * 1024 * 1024 + 1) + b"}",
        "application/json",
        413,
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "payload", "content_type", "code"),
    [case[1:] for case in BODIES],
    ids=[case[0] for case in BODIES],
)
async def test_bad_bodies_are_refused(
    gatekeeper: Running,
    apiserver: APIServer,
    method: str,
    path: str,
    payload: bytes,
    content_type: str,
    code: int,
) -> None:
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.request(
            method, path, data=payload, headers={"Content-Type": content_type}
        )
        body = await response.json()
    assert response.status == code, body
    assert body["kind"] == "Status"
    assert writes(apiserver) == []


async def test_url_and_body_must_agree(gatekeeper: Running, apiserver: APIServer) -> None:
    seed(apiserver, name=NAME)
    mismatches = [
        ("POST", SLICES, {**slice_body(), "kind": "DeviceClass"}),
        ("POST", SLICES, {**slice_body(), "apiVersion": "resource.k8s.io/v1beta1"}),
        ("PUT", f"{SLICES}/{NAME}", slice_body(name="another-name")),
    ]
    for method, path, body in mismatches:
        status, _, answer = await raw_request(gatekeeper, method, path, body)
        assert status == 400, answer
    assert writes(apiserver) == []


def remove(apiserver: APIServer) -> None:
    """Delete the object directly in the store (another actor, not through the gatekeeper)."""
    if apiserver.get("resource.k8s.io", "resourceslices", NAME) is not None:
        apiserver.store.delete(("resource.k8s.io", "resourceslices"), ("", NAME))


class FlipsOwnership(InterleavedUpstream):
    """The real upstream, plus another actor who replaces the object after the fetch, at once
    (``delay`` 0: before the gatekeeper goes on) or ``delay`` seconds later: it is deleted and
    re-created by the NIC driver under the same name."""

    def __init__(self, apiserver: APIServer, delay: float | None) -> None:
        super().__init__(
            UpstreamConfig(server=apiserver.url, token=NODE_TOKEN), after_read=self._after
        )
        self.apiserver = apiserver
        self.delay = delay
        self._late: list[asyncio.Future[None]] = []

    def _after(self, path: str) -> None:
        if self.delay == 0:
            self.flip()
        elif self.delay is not None:
            landed = asyncio.get_running_loop().create_future()
            self._late.append(landed)
            asyncio.get_running_loop().call_later(self.delay, self._flip_late, landed)

    def _flip_late(self, landed: asyncio.Future[None]) -> None:
        self.flip()
        landed.set_result(None)

    async def landed(self) -> None:
        """Every flip scheduled so far has happened."""
        late, self._late = self._late, []
        await asyncio.wait_for(asyncio.gather(*late), timeout=10)

    def flip(self) -> None:
        remove(self.apiserver)
        body = slice_body(name=NAME, driver=NIC)
        body["metadata"]["labels"] = {"owner": "nic"}
        self.apiserver.add(body)


WRITES = [
    pytest.param("PUT", None, id="update"),
    pytest.param("PATCH", MERGE, id="merge-patch"),
    pytest.param("PATCH", JSON_PATCH, id="json-patch"),
    pytest.param("DELETE", None, id="delete"),
]


async def driver_write(running: Running, method: str, media_type: str | None) -> int:
    async with running.unix_session(GPU) as session:
        if method == "PUT":
            body = slice_body(name=NAME)
            body["metadata"]["labels"] = {"touched": "gpu"}
            response = await session.put(f"{SLICES}/{NAME}", json=body)
        elif method == "PATCH":
            patch: Any = {"metadata": {"labels": {"touched": "gpu"}}}
            if media_type == JSON_PATCH:
                patch = [{"op": "add", "path": "/metadata/labels", "value": {"touched": "gpu"}}]
            response = await session.patch(
                f"{SLICES}/{NAME}",
                data=json.dumps(patch),
                headers={"Content-Type": media_type or ""},
            )
        else:
            response = await session.delete(f"{SLICES}/{NAME}")
        await response.read()
        return response.status


@pytest.mark.parametrize(("method", "media_type"), WRITES)
async def test_ownership_flip_between_fetch_and_forward_is_a_conflict(
    apiserver: APIServer, policy: Any, pki: PKI, method: str, media_type: str | None
) -> None:
    """Deterministic: the flip always lands in the window; the write fails with 409."""
    seed(apiserver, name=NAME)
    upstream = FlipsOwnership(apiserver, delay=0)
    async with running_gatekeeper(apiserver, policy, pki, upstream=upstream) as running:
        status = await driver_write(running, method, media_type)
    # The apiserver answers a failed JSON-patch `test` op with 422, other stale writes with 409.
    assert status == (422 if media_type == JSON_PATCH else 409)
    obj = apiserver.get("resource.k8s.io", "resourceslices", NAME)
    assert obj is not None and obj["spec"]["driver"] == NIC
    assert "touched" not in obj["metadata"].get("labels", {})


@pytest.mark.parametrize(("method", "media_type"), WRITES)
async def test_random_interleavings_never_bypass(
    apiserver: APIServer, policy: Any, pki: PKI, method: str, media_type: str | None
) -> None:
    """200 runs per write kind with the flip at a random moment: before, during or after."""
    rng = random.Random(20261202)
    outcomes: dict[int, int] = {}
    upstream = FlipsOwnership(apiserver, delay=None)
    async with running_gatekeeper(apiserver, policy, pki, upstream=upstream) as running:
        for _ in range(200):
            remove(apiserver)
            seed(apiserver, name=NAME)
            upstream.delay = rng.uniform(0, 0.004)
            status = await driver_write(running, method, media_type)
            await upstream.landed()  # a late flip, after the answer, is judged too
            obj = apiserver.get("resource.k8s.io", "resourceslices", NAME)
            assert obj is not None and obj["spec"]["driver"] == NIC
            assert obj["metadata"].get("labels", {}).get("touched") != "gpu", "bypass"
            outcomes[status] = outcomes.get(status, 0) + 1
    assert set(outcomes) <= {200, 403, 404, 409, 422}, outcomes
