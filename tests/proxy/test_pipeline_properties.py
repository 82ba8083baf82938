"""Random request sequences from two drivers through the whole proxy (real sockets, the
embedded API server): a request the gatekeeper refuses never reaches the API server, one it
allows reaches it once (or is a read answered from the object it checked), and no driver
ever leaves an object in the store that breaks the rules.

Bounded by the hypothesis profile (``ci`` by default; ``long`` in
docs/development.md#property-tests).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import quote

import aiohttp
from hypothesis import given, note
from hypothesis import strategies as st

from gatekeeper.apiserver import APIServer, resource_slice
from gatekeeper.cli.served import served_kinds
from gatekeeper.policy import Policy
from gatekeeper.policy.ownership import pool_name_ok
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PKI,
    RecordingSink,
    running_gatekeeper,
)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
POOLS = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
NAMES = ["node-a-gpu", "node-a-nic", "s1", "node-a"]
DRIVERS = [GPU, NIC]
_FORBID = "forbid"


def _selector(driver: str, node: str) -> str:
    return "fieldSelector=" + quote(f"spec.nodeName={node},spec.driver={driver}", safe="")


_slice_bodies = st.builds(
    lambda name, driver, node, pool: resource_slice(name, driver=driver, node=node, pool=pool),
    st.sampled_from(NAMES),
    st.sampled_from([*DRIVERS, "evil.example.com"]),
    st.sampled_from([NODE, "node-b"]),
    st.sampled_from([NODE, "node-a/x", "node-a-b", "node-b", "other"]),
)
_patches = st.sampled_from(
    [
        {"spec": {"nodeName": "node-b"}},
        {"spec": {"driver": NIC}},
        {"spec": {"pool": {"name": "node-a-b"}}},
        {"metadata": {"labels": {"a": "b"}}},
        {"spec": {"allNodes": True}},
    ]
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, str, Any]:
    """(driver, method, target, body)."""
    driver = draw(st.sampled_from(DRIVERS))
    name = draw(st.sampled_from(NAMES))
    kind = draw(st.integers(0, 9))
    if kind == 0:
        sel_driver, sel_node = draw(st.sampled_from(DRIVERS)), draw(st.sampled_from([NODE, "x"]))
        method = draw(st.sampled_from(["GET", "DELETE"]))
        return driver, method, f"{SLICES}?{_selector(sel_driver, sel_node)}", None
    if kind == 1:
        return driver, "POST", SLICES, draw(_slice_bodies)
    if kind == 2:
        body = draw(_slice_bodies)
        body["metadata"]["name"] = name
        return driver, "PUT", f"{SLICES}/{name}", body
    if kind == 3:
        return driver, "PATCH", f"{SLICES}/{name}", draw(_patches)
    if kind == 4:
        return driver, draw(st.sampled_from(["GET", "DELETE"])), f"{SLICES}/{name}", None
    if kind == 5:
        spec = {"driver": driver, "nodeName": NODE}
        pool = {"apiVersion": "devmgmtproto.k8s.io/v1alpha1", "kind": "DevicePool",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip
        return driver, "POST", POOLS, pool
    if kind == 6:
        return driver, "GET", CLAIMS, None
    if kind == 7:
        return driver, "GET", draw(st.sampled_from(["/version", "/apis", "/api/v1/secrets"])), None
    if kind == 8:
        # Watches that are refused (another driver's, or unpinned): an allowed one would stay
        # open until its timeout, and allowed watches are covered in proxy/test_pipeline.py.
        other = NIC if driver == GPU else GPU
        selector = draw(st.sampled_from([_selector(other, NODE), "limit=1"]))
        return driver, "GET", f"{SLICES}?watch=true&{selector}", None
    return driver, "DELETE", f"{POOLS}/{name}", None


async def _send(
    session: aiohttp.ClientSession, method: str, target: str, body: Any
) -> tuple[int, str]:
    headers = {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = (
            "application/merge-patch+json" if method == "PATCH" else "application/json"
        )
    async with session.request(method, target, data=data, headers=headers) as response:
        await response.read()
        return response.status, response.headers.get("Audit-Id", "")


def _audit_id(headers: dict[str, str]) -> str:
    """The Audit-ID the gatekeeper forwarded (header names as received, any case)."""
    return next((v for k, v in headers.items() if k.lower() == "audit-id"), "")


def _check_store(apiserver: APIServer) -> None:
    for obj in apiserver.objects("resource.k8s.io", "resourceslices"):
        spec = obj["spec"]
        assert spec["driver"] in DRIVERS and spec["nodeName"] == NODE, obj
        assert pool_name_ok(spec["pool"]["name"], NODE), obj
    for obj in apiserver.objects("devmgmtproto.k8s.io", "devicepools"):
        assert obj["metadata"]["name"] == NODE and obj["spec"]["nodeName"] == NODE, obj


async def _run(
    sequence: list[tuple[str, str, str, Any]],
    apiserver: APIServer,
    sessions: dict[str, aiohttp.ClientSession],
    sink: RecordingSink,
) -> None:
    for driver, method, target, body in sequence:
        before = len(apiserver.journal)
        status, audit_id = await _send(sessions[driver], method, target, body)
        note(f"{driver} {method} {target} -> {status}")
        (event,) = [e for e in sink.by_id(audit_id) if e["stage"] == "ResponseComplete"]
        new = apiserver.journal[before:]
        forwarded = [e for e in new if _audit_id(e.headers) == audit_id]
        if event["annotations"].get("authorization.k8s.io/decision") == _FORBID:
            assert not forwarded, (method, target)
            # At most the gatekeeper's own read of the stored object, never a write.
            assert all(e.method == "GET" for e in new), [(e.method, e.path) for e in new]
        elif not forwarded:
            # Allowed and answered from the object the gatekeeper read and checked (a get).
            assert method == "GET" and all(e.method == "GET" for e in new), (method, target)
        else:
            assert len(forwarded) == 1, (method, target, status)
    _check_store(apiserver)


def test_refused_requests_never_reach_the_apiserver(policy: Policy, pki: PKI) -> None:
    loop = asyncio.new_event_loop()

    async def start() -> tuple[APIServer, Any, dict[str, aiohttp.ClientSession], RecordingSink]:
        apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
        await apiserver.start()
        apiserver.add(resource_slice("node-a-gpu", driver=GPU, node=NODE, pool=NODE))
        apiserver.add(resource_slice("node-a-nic", driver=NIC, node=NODE, pool="node-a/nic"))
        sink = RecordingSink()
        context = running_gatekeeper(apiserver, policy, pki, audit_sink=sink)
        running = await context.__aenter__()
        sessions = {driver: running.unix_session(driver) for driver in DRIVERS}
        return apiserver, context, sessions, sink

    apiserver, context, sessions, sink = loop.run_until_complete(start())

    runs: list[int] = []

    @given(st.lists(requests(), min_size=1, max_size=6))
    def run(sequence: list[tuple[str, str, str, Any]]) -> None:
        loop.run_until_complete(_run(sequence, apiserver, sessions, sink))
        runs.append(len(sequence))

    try:
        run()
        assert len(runs) >= 10 and len(sink.events) >= sum(runs)  # the sequences really ran
    finally:

        async def stop() -> None:
            for session in sessions.values():
                await session.close()
            await context.__aexit__(None, None, None)
            await apiserver.close()

        loop.run_until_complete(stop())
        loop.close()
