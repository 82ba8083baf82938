"""Connection limits over real sockets: a driver holding many idle or half-sent connections
cannot take the others' place; slowloris connections are closed; what aiohttp refuses before
the handler is still a Status with an Audit-Id and an audit event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gatekeeper.limits import Limits
from gatekeeper.policy import Policy
from gatekeeper.testing import APIServer
from gatekeeper.testing.harness import GPU, NIC, PKI, RecordingSink, Running, running_gatekeeper
from tests.rawhttp import build_request, send_raw

LIMITS = Limits(connections_per_driver=8, connections_total=20, header_timeout=0.5)


@pytest.fixture
async def guarded(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> AsyncIterator[tuple[Running, RecordingSink]]:
    sink = RecordingSink()
    async with running_gatekeeper(
        apiserver, policy, pki, audit_sink=sink, limits=LIMITS
    ) as running:
        yield running, sink


async def _open(path: Path, count: int, data: bytes = b"") -> list[asyncio.StreamWriter]:
    writers = []
    for _ in range(count):
        _, writer = await asyncio.open_unix_connection(str(path))
        if data:
            writer.write(data)
        writers.append(writer)
    await asyncio.sleep(0.05)  # let the gatekeeper accept them
    return writers


async def test_one_driver_cannot_hold_every_connection(
    guarded: tuple[Running, RecordingSink],
) -> None:
    running, _ = guarded
    held = await _open(running.socket_path(GPU), 8, b"GET /version HTTP/1.1\r\nHo")
    try:
        refused = await send_raw(running.socket_path(GPU), build_request("GET", "/version"))
        assert refused.status == 429 and refused.headers["retry-after"] == "1"
        assert "too many connections" in refused.json()["message"]
        other = await send_raw(running.socket_path(NIC), build_request("GET", "/version"))
        assert other.status == 200
    finally:
        for writer in held:
            writer.close()


async def test_the_total_cap_holds_before_descriptors_run_out(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    limits = Limits(connections_per_driver=8, connections_total=12)
    async with running_gatekeeper(apiserver, policy, pki, limits=limits) as running:
        held = await _open(running.socket_path(GPU), 8)
        held += await _open(running.socket_path(NIC), 4)
        try:
            refused = await send_raw(running.socket_path(NIC), build_request("GET", "/version"))
            assert refused.status == 429
            assert "12 open connections, its limit" in refused.json()["message"]
        finally:
            for writer in held[:8]:
                writer.close()
        await asyncio.sleep(0.05)
        served = await send_raw(running.socket_path(NIC), build_request("GET", "/version"))
        assert served.status == 200
        for writer in held[8:]:
            writer.close()


async def test_slowloris_connections_are_closed(guarded: tuple[Running, RecordingSink]) -> None:
    running, _ = guarded
    reader, writer = await asyncio.open_unix_connection(str(running.socket_path(GPU)))
    writer.write(b"GET /version HTTP/1.1\r\nHost: x\r\n")  # the headers never end
    await writer.drain()
    # Closed by the header timeout (0.5 s): EOF well before this generous bound.
    assert await asyncio.wait_for(reader.read(), timeout=20) == b""
    writer.close()
    after = await send_raw(running.socket_path(GPU), build_request("GET", "/version"))
    assert after.status == 200


async def test_a_slow_body_is_not_a_header_timeout(guarded: tuple[Running, RecordingSink]) -> None:
    """Headers complete at once; the body trickles in slower than the header timeout."""
    running, _ = guarded
    body = b'{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice"}'
    request = build_request(
        "POST", "/apis/resource.k8s.io/v1/resourceslices", {"Content-Type": "application/json"},
        body,
    )  # fmt: skip
    head, _, rest = request.partition(b"\r\n\r\n")
    reader, writer = await asyncio.open_unix_connection(str(running.socket_path(GPU)))
    writer.write(head + b"\r\n\r\n" + rest[:10])
    await asyncio.sleep(0.8)
    writer.write(rest[10:])
    answer = await asyncio.wait_for(reader.read(), timeout=20)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 403")  # decided (no pool name), not cut off


async def test_malformed_requests_are_a_status_and_an_event(
    guarded: tuple[Running, RecordingSink],
) -> None:
    running, sink = guarded
    raw = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
    answer = await send_raw(running.socket_path(GPU), raw)
    assert answer.status == 400
    status = answer.json()
    assert status["kind"] == "Status" and "Duplicate Content-Length" in status["message"]
    (event,) = sink.by_id(answer.headers["audit-id"])
    assert event["annotations"]["authorization.k8s.io/decision"] == "forbid"
    assert event["responseStatus"]["code"] == 400


async def test_metrics_count_what_no_event_counts(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    limits = Limits(connections_per_driver=2, header_timeout=0.3)
    async with running_gatekeeper(
        apiserver, policy, pki, limits=limits, health_listen=("127.0.0.1", 0)
    ) as running:
        held = await _open(running.socket_path(GPU), 2)
        refused = await send_raw(running.socket_path(GPU), build_request("GET", "/version"))
        assert refused.status == 429
        for writer in held:
            writer.close()
        bad = await send_raw(running.socket_path(NIC), b"GET /version HTTP/1.1\r\nX: a\0b\r\n\r\n")
        assert bad.status == 400
        url = f"http://127.0.0.1:{running.server.health_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            text = await response.text()
    assert f'dra_gatekeeper_connections_refused_total{{caller="{GPU}"}} 1.0' in text
    assert "dra_gatekeeper_malformed_requests_total 1.0" in text
    assert "dra_gatekeeper_unevaluable_objects_dropped_total" in text


async def test_a_body_that_never_completes_is_408(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    limits = Limits(body_timeout=0.3)
    sink = RecordingSink()
    async with running_gatekeeper(
        apiserver, policy, pki, limits=limits, audit_sink=sink
    ) as running:
        head = (
            "POST /apis/resource.k8s.io/v1/resourceslices HTTP/1.1\r\nHost: x\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        reader, writer = await asyncio.open_unix_connection(str(running.socket_path(GPU)))
        writer.write(head.encode() + b'{"apiVersion":')  # and never the rest
        answer = await asyncio.wait_for(reader.read(65536), timeout=20)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408")
    assert b"did not arrive within 0.3 seconds" in answer
    assert apiserver.journal == []


async def test_the_issues_300_half_open_connections(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """The finding as reported: 300 half-open connections from one driver, default limits.
    The driver keeps 128 (its cap, until the header timeout), the rest are refused at once,
    and the other driver is answered."""
    async with running_gatekeeper(apiserver, policy, pki) as running:
        held = await _open(running.socket_path(GPU), 300, b"GET /version HTTP/1.1\r\nHo")
        try:
            guard = running.server._runners[0].guard  # type: ignore[attr-defined]
            assert guard.open[GPU] == 128 and guard.refused[GPU] == 300 - 128
            other = await send_raw(running.socket_path(NIC), build_request("GET", "/version"))
            assert other.status == 200
        finally:
            for writer in held:
                writer.close()
