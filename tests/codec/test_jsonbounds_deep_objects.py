"""Upstream objects as deep as the apiserver stores them (10,000 levels): a filtered claim list,
get or watch drops what the gatekeeper cannot evaluate and serves the rest; a fetch of a deep
stored object is a 502 Status, never a crash. The upstream is a real HTTP server on loopback
that sends the deep bytes as the apiserver would (built by string, not by a recursive dump).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gatekeeper.audit import AuditLevel
from gatekeeper.policy import Policy
from gatekeeper.proxy import scoped
from gatekeeper.proxy.scoped import DROPPED_ANNOTATION
from gatekeeper.server.config import AuditSettings
from gatekeeper.testing.harness import GPU, NODE, PKI, RecordingSink, running_gatekeeper

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DEPTH = 10_000
_HOLE = "__DEEP__"


def _claim(name: str, *, deep: bool = False) -> str:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"u-{name}"},
        "spec": {"devices": {"requests": [{"name": "req"}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "req", "driver": GPU, "pool": NODE, "device": "d"}]
                },
                "nodeSelector": {"nodeSelectorTerms": [term]},
            }
        },
    }
    if deep:
        obj["spec"]["devices"]["config"] = [{"opaque": {"driver": GPU, "parameters": _HOLE}}]
    text = json.dumps(obj, separators=(",", ":"))
    return text.replace(f'"{_HOLE}"', '{"a":' * DEPTH + "1" + "}" * DEPTH)


class DeepUpstream:
    """Serves claims ``mine``, ``deep`` (10,000 levels, in scope) and ``mine2``."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        json_type = "application/json"
        if request.path == CLAIMS and request.query.get("watch"):
            response = web.StreamResponse(headers={"Content-Type": json_type})
            await response.prepare(request)
            for name in ("mine", "deep", "mine2"):
                event = '{"type":"ADDED","object":' + _claim(name, deep=name == "deep") + "}\n"
                await response.write(event.encode())
            await response.write_eof()
            return response
        if request.path == CLAIMS:
            items = ",".join(_claim(n, deep=n == "deep") for n in ("mine", "deep", "mine2"))
            body = (
                '{"kind":"ResourceClaimList","apiVersion":"resource.k8s.io/v1",'
                '"metadata":{"resourceVersion":"10"},"items":[' + items + "]}"
            )
            return web.Response(body=body.encode(), content_type=json_type)
        if request.path == SLICES:
            deep = '{"a":' * DEPTH + "1" + "}" * DEPTH
            body = '{"kind":"ResourceSliceList","items":[{"spec":' + deep + "}]}"
            return web.Response(body=body.encode(), content_type=json_type)
        if request.path == f"{CLAIMS}/deep" and request.method == "GET":
            return web.Response(body=_claim("deep", deep=True).encode(), content_type=json_type)
        return web.json_response({"kind": "Status", "code": 418}, status=418)


@pytest.fixture
async def deep_upstream() -> AsyncIterator[DeepUpstream]:
    upstream = DeepUpstream()
    await upstream.start()
    yield upstream
    await upstream.close()


@pytest.fixture
async def deep_gatekeeper(
    deep_upstream: DeepUpstream, policy: Policy, pki: PKI
) -> AsyncIterator[tuple[Any, RecordingSink]]:
    sink = RecordingSink()
    async with running_gatekeeper(
        deep_upstream,  # type: ignore[arg-type]
        policy,
        pki,
        audit_sink=sink,
        audit=AuditSettings(level=AuditLevel.REQUEST_RESPONSE),
    ) as running:
        yield running, sink


def _names(document: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in document["items"]]


async def test_filtered_list_drops_the_deep_claim_and_serves_the_rest(
    deep_gatekeeper: tuple[Any, RecordingSink],
) -> None:
    running, sink = deep_gatekeeper
    before = scoped.DROPPED.value
    async with running.unix_session(GPU) as session, session.get(CLAIMS) as response:
        assert response.status == 200, await response.text()
        assert _names(await response.json()) == ["mine", "mine2"]
    assert scoped.DROPPED.value == before + 1
    event = sink.events[-1]
    assert event["responseStatus"]["code"] == 200
    assert event["annotations"][DROPPED_ANNOTATION] == "1: default/deep"


async def test_filtered_watch_drops_the_deep_claim_and_goes_on(
    deep_gatekeeper: tuple[Any, RecordingSink],
) -> None:
    running, sink = deep_gatekeeper
    async with (
        running.unix_session(GPU) as session,
        session.get(CLAIMS, params={"watch": "1"}) as response,
    ):
        assert response.status == 200
        lines = [json.loads(line) async for line in response.content if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [
        ("ADDED", "mine"),
        ("ADDED", "mine2"),
    ]
    assert sink.events[-1]["annotations"][DROPPED_ANNOTATION] == "1: default/deep"


async def test_get_of_the_deep_claim_is_a_502_status(
    deep_gatekeeper: tuple[Any, RecordingSink],
) -> None:
    """A get fetches the stored object to decide: one too deep to evaluate is not shown."""
    running, _ = deep_gatekeeper
    async with running.unix_session(GPU) as session, session.get(f"{CLAIMS}/deep") as response:
        assert response.status == 502
        status = await response.json()
        assert status["kind"] == "Status"
        assert "nested more than 200 levels" in status["message"]


async def test_fetch_of_a_deep_stored_object_is_a_502_status(
    deep_gatekeeper: tuple[Any, RecordingSink], deep_upstream: DeepUpstream
) -> None:
    running, sink = deep_gatekeeper
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "status": {}}
    async with (
        running.unix_session(GPU) as session,
        session.put(f"{CLAIMS}/deep/status", json=body) as response,
    ):
        assert response.status == 502
        status = await response.json()
        assert "nested more than 200 levels" in status["message"]
        assert response.headers["Audit-Id"]
    assert ("PUT", f"{CLAIMS}/deep/status") not in deep_upstream.requests
    assert sink.events[-1]["responseStatus"]["code"] == 502


async def test_deep_unfiltered_list_passes_and_is_audited_without_its_body(
    deep_gatekeeper: tuple[Any, RecordingSink],
) -> None:
    """RequestResponse level: an unfiltered answer too deep to log keeps metadata only."""
    running, sink = deep_gatekeeper
    selector = {"fieldSelector": f"spec.nodeName={NODE},spec.driver={GPU}"}
    async with (
        running.unix_session(GPU) as session,
        session.get(SLICES, params=selector) as response,
    ):
        assert response.status == 200
        body = await response.read()
    assert body.count(b'{"a":') == DEPTH  # streamed through untouched
    event = sink.events[-1]
    assert event["responseStatus"]["code"] == 200
    assert "responseObject" not in event
