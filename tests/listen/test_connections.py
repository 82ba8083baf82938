"""Connection limits over real sockets: a driver holding many idle or half-sent connections
cannot take the others' place; slowloris connections are closed; what aiohttp refuses before
the handler is still a Status with an Audit-Id and an audit event."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.limits import Limits
from gatekeeper.listen.capacity import UNAUTHENTICATED
from gatekeeper.policy import Policy
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    PKI,
    SERVE,
    RecordingSink,
    Running,
    free_port,
    metric_samples,
    running_gatekeeper,
    token_kubeconfig,
    wait_ready,
)
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


async def _open(
    running: Running, driver: str, count: int, data: bytes = b""
) -> list[asyncio.StreamWriter]:
    """``count`` connections to ``driver``'s socket, returned once the gatekeeper has counted
    each (held, or refused as over a cap)."""
    guard = running.server.guard
    assert guard is not None
    key = ("unix", driver)
    before = guard.open[key] + guard.refused[key]
    writers = []
    for _ in range(count):
        _, writer = await asyncio.open_unix_connection(str(running.socket_path(driver)))
        if data:
            writer.write(data)
        writers.append(writer)
    await _until(lambda: guard.open[key] + guard.refused[key] >= before + count)
    return writers


async def test_one_driver_cannot_hold_every_connection(
    guarded: tuple[Running, RecordingSink],
) -> None:
    running, sink = guarded
    held = await _open(running, GPU, 8, b"GET /version HTTP/1.1\r\nHo")
    try:
        refused = await send_raw(running.socket_path(GPU), build_request("GET", "/version"))
        assert refused.status == 429 and refused.headers["retry-after"] == "1"
        assert "too many connections" in refused.json()["message"]
        (event,) = sink.by_id(refused.headers["audit-id"])
        assert event["annotations"]["dra-gatekeeper.io/rule"] == "rate-limited"
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
        held = await _open(running, GPU, 8)
        held += await _open(running, NIC, 4)
        try:
            refused = await send_raw(running.socket_path(NIC), build_request("GET", "/version"))
            assert refused.status == 429
            assert "12 open connections on its unix listeners" in refused.json()["message"]
        finally:
            for writer in held[:8]:
                writer.close()
        guard = running.server.guard
        assert guard is not None
        await _until(lambda: guard.open[("unix", GPU)] == 0)
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
    guard = running.server.guard
    assert guard is not None
    body = b'{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice"}'
    request = build_request(
        "POST", "/apis/resource.k8s.io/v1/resourceslices", {"Content-Type": "application/json"},
        body,
    )  # fmt: skip
    head, _, rest = request.partition(b"\r\n\r\n")
    reader, writer = await asyncio.open_unix_connection(str(running.socket_path(GPU)))
    writer.write(head + b"\r\n\r\n" + rest[:10])
    await writer.drain()
    # A witness whose headers never end, opened after: once the header timeout has closed
    # it, the slow body has waited longer than the header timeout too.
    witness, witnessed = await asyncio.open_unix_connection(str(running.socket_path(GPU)))
    witnessed.write(b"GET /version HTTP/1.1\r\nHost: x\r\n")
    assert await asyncio.wait_for(witness.read(), timeout=20) == b""
    assert guard.header_timeouts == 1
    writer.write(rest[10:])
    answer = await asyncio.wait_for(reader.read(), timeout=20)
    writer.close()
    witnessed.close()
    assert answer.startswith(b"HTTP/1.1 403")  # decided (no pool name), not cut off
    assert guard.header_timeouts == 1


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> None:
    """The whole body of an answer whose ``head`` was read: by its Content-Length (a passed
    answer keeps the upstream's), else to the last chunk."""
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            await reader.readexactly(int(value))
            return
    assert b"Transfer-Encoding: chunked" in head
    await reader.readuntil(b"\r\n0\r\n\r\n")  # the last chunk


async def test_the_next_request_on_a_connection_is_timed_from_its_first_byte(
    guarded: tuple[Running, RecordingSink],
) -> None:
    """A keep-alive connection: the first request is answered, the second one's headers never
    end; the header timeout closes it (an answered request does not leave the timer off)."""
    running, _ = guarded
    guard = running.server.guard
    assert guard is not None
    reader, writer = await asyncio.open_unix_connection(str(running.socket_path(GPU)))
    writer.write(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")  # HTTP/1.1: kept alive
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=20)
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
    await asyncio.wait_for(_read_body(reader, head), timeout=20)
    writer.write(b"GET /version HTTP/1.1\r\nHost: x\r\n")  # the headers never end
    assert await asyncio.wait_for(reader.read(), timeout=20) == b""
    assert guard.header_timeouts == 1
    writer.close()


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
    assert event["annotations"]["dra-gatekeeper.io/rule"] == "malformed-http"
    assert event["responseStatus"]["code"] == 400


async def test_metrics_count_what_no_event_counts(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    limits = Limits(connections_per_driver=2, header_timeout=0.3)
    async with running_gatekeeper(
        apiserver, policy, pki, limits=limits, health_listen=("127.0.0.1", 0)
    ) as running:
        held = await _open(running, GPU, 2)
        refused = await send_raw(running.socket_path(GPU), build_request("GET", "/version"))
        assert refused.status == 429
        for writer in held:
            writer.close()
        bad = await send_raw(running.socket_path(NIC), b"GET /version HTTP/1.1\r\nX: a\0b\r\n\r\n")
        assert bad.status == 400
        url = f"http://127.0.0.1:{running.server.health_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            text = await response.text()
    refused = 'dra_gatekeeper_connections_refused_total{caller="gpu.example.com",listener="unix"}'
    assert f"{refused} 1.0" in text
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
        held = await _open(running, GPU, 300, b"GET /version HTTP/1.1\r\nHo")
        try:
            guard = running.server.guard
            assert guard is not None
            assert guard.open[("unix", GPU)] == 128
            assert guard.refused[("unix", GPU)] == 300 - 128
            other = await send_raw(running.socket_path(NIC), build_request("GET", "/version"))
            assert other.status == 200
        finally:
            for writer in held:
                writer.close()


# --- no one without a credential can crowd out the drivers ----------------------------------

ATTACKERS = [f"127.0.0.{host}" for host in range(2, 10)]
"""Source addresses a local process without a credential can use (any of 127.0.0.0/8)."""


async def _until(check: Callable[[], bool]) -> None:
    """Poll the gatekeeper's own state until ``check`` holds (bounded)."""
    async with asyncio.timeout(30):
        while not check():
            await asyncio.sleep(0.01)


async def _metrics(running: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    url = f"http://127.0.0.1:{running.server.health_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return metric_samples(await response.text())


async def _tls_without_certificate(port: int, pki: PKI, source: str) -> None:
    """A TLS connection with no client certificate, left idle (TLS 1.3: the client's side of
    the handshake ends before the server checks; then the server refuses it)."""
    with contextlib.suppress(ssl.SSLError, ConnectionError):
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=pki.client_context(None), local_addr=(source, 0)
        )
        writer.close()


async def test_connections_without_a_credential_never_crowd_out_drivers(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """The finding as reported, with the default limits: a process with no credential opens
    128 TLS connections without a client certificate from each of 127.0.0.2 … 127.0.0.9, then
    128 from each that never start a handshake, and keeps them. Every driver keeps working, on
    its Unix socket and over mTLS (a new connection, handshake and all); the gatekeeper holds
    at most its small unauthenticated bucket of them; /metrics gains no series per address."""
    async with running_gatekeeper(
        apiserver, policy, pki, health_listen=("127.0.0.1", 0)
    ) as running:
        guard = running.server.guard
        assert guard is not None
        port = running.server.tls_port
        assert port is not None
        for source in ATTACKERS:
            await asyncio.gather(*(_tls_without_certificate(port, pki, source) for _ in range(128)))
        failures = "dra_gatekeeper_tls_handshake_failures_total"
        await _until(lambda: not guard.open[("mtls", UNAUTHENTICATED)])
        samples = await _metrics(running)
        assert sum(v for (name, _), v in samples.items() if name == failures) == 8 * 128
        held: list[asyncio.StreamWriter] = []
        for source in ATTACKERS:
            opened = await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
                  for _ in range(128))
            )  # fmt: skip
            held += [writer for _, writer in opened]
        bucket = Limits().connections_unauthenticated
        key = ("mtls", UNAUTHENTICATED)
        await _until(lambda: guard.open[key] + guard.refused[key] == 8 * 128)
        try:
            assert guard.open[key] == bucket and not guard.totals["mtls"]
            for driver in (GPU, NIC):
                served = await send_raw(
                    running.socket_path(driver), build_request("GET", "/version")
                )
                assert served.status == 200
                async with running.tls_session(driver) as session, session.get("/version") as ok:
                    assert ok.status == 200, await ok.text()
            # The CA signed this one, but the policy names no such driver: 403, and no series.
            async with (
                running.tls_session("evil.example.com") as stranger,
                stranger.get("/version") as refused,
            ):
                assert refused.status == 403
            samples = await _metrics(running)
        finally:
            for writer in held:
                writer.close()
    connection_series = [
        dict(labels)
        for (name, labels), _ in samples.items()
        if name.startswith("dra_gatekeeper_connections_")
    ]
    assert {series["caller"] for series in connection_series} <= {GPU, NIC, UNAUTHENTICATED}
    assert len(connection_series) <= 2 * 2 * 3  # open and refused, two listener kinds, 3 callers
    everything = repr(samples)
    assert not any(source in everything for source in ATTACKERS) and "evil" not in everything


async def test_unix_sockets_and_mtls_never_share_a_cap(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    limits = Limits(connections_per_driver=8, connections_total=8)
    async with running_gatekeeper(apiserver, policy, pki, limits=limits) as running:
        guard = running.server.guard
        assert guard is not None
        port = running.server.tls_port
        held = [
            (await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context(GPU)))[1]
            for _ in range(8)
        ]
        await _until(lambda: guard.totals["mtls"] == 8)
        try:
            async with running.tls_session(NIC) as session, session.get("/version") as refused:
                assert refused.status == 429
                assert "on its mtls listeners" in (await refused.json())["message"]
            served = await send_raw(running.socket_path(NIC), build_request("GET", "/version"))
            assert served.status == 200  # the Unix listeners' capacity is their own
        finally:
            for writer in held:
                writer.close()


async def test_the_unauthenticated_bucket_closes_its_oldest(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """Connections that never start a handshake fill the bucket; a driver's new connection
    still gets in (the oldest idle one is closed for it), and is then counted as the driver's."""
    limits = Limits(connections_unauthenticated=4)
    async with running_gatekeeper(apiserver, policy, pki, limits=limits) as running:
        guard = running.server.guard
        assert guard is not None
        port = running.server.tls_port
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        key = ("mtls", UNAUTHENTICATED)
        await _until(lambda: guard.open[key] == 4)
        async with running.tls_session(GPU) as session, session.get("/version") as ok:
            assert ok.status == 200
            assert guard.open[("mtls", GPU)] == 1 and guard.refused[key] == 1
        assert await asyncio.wait_for(idle[0][0].read(), 10) == b""  # the oldest, closed
        for _, writer in idle:
            writer.close()


def _blocking_tls_get(port: int, pki: PKI, driver: str) -> bytes:
    """A client that sends its request the moment its handshake ends (as Go's and the
    standard library's do), on a plain blocking socket."""
    context = pki.client_context(driver)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=20) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(b"GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return tls.recv(64)


async def test_a_served_process_keeps_drivers_in_under_the_attack(
    apiserver: APIServer, pki: PKI, tmp_path: Path
) -> None:
    """The same attack on a real ``serve`` process (uvloop, as deployed), with a small
    unauthenticated bucket so that it overflows: cert-less TLS and idle TCP from eight
    addresses; a driver's client that speaks first still gets in, over mTLS and its socket."""
    sockets, health, port = tmp_path / "s", free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        *SERVE,
        *("--node-name", "node-a", "--driver", GPU, "--socket-dir", str(sockets)),
        *("--kubeconfig", token_kubeconfig(tmp_path / "kc", apiserver.url)),
        *("--health-listen", f"127.0.0.1:{health}", "--listen", f"127.0.0.1:{port}"),
        *("--tls-cert-file", pki.path("server.crt"), "--tls-key-file", pki.path("server.key")),
        *("--client-ca-file", pki.path("ca.crt"), "--max-unauthenticated-connections", "32"),
        stderr=asyncio.subprocess.DEVNULL,
    )
    held: list[asyncio.StreamWriter] = []
    try:
        await wait_ready(health)
        for source in ATTACKERS:
            await asyncio.gather(*(_tls_without_certificate(port, pki, source) for _ in range(16)))
            opened = await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
                  for _ in range(16))
            )  # fmt: skip
            held += [writer for _, writer in opened]
        for _ in range(3):
            answer = await asyncio.to_thread(_blocking_tls_get, port, pki, GPU)
            assert answer.startswith(b"HTTP/1.1 200"), answer
        served = await send_raw(sockets / GPU / "api.sock", build_request("GET", "/version"))
        assert served.status == 200
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{health}/metrics"
            async with session.get(url) as response:
                samples = metric_samples(await response.text())
        failures = sum(
            value
            for (name, _), value in samples.items()
            if name == "dra_gatekeeper_tls_handshake_failures_total"
        )
        assert failures == 8 * 16
        open_now = {
            dict(labels)["caller"]: value
            for (name, labels), value in samples.items()
            if name == "dra_gatekeeper_connections_open" and dict(labels)["listener"] == "mtls"
        }
        assert open_now.get(UNAUTHENTICATED, 0) <= 32
        assert not any(source in repr(samples) for source in ATTACKERS)
    finally:
        for writer in held:
            writer.close()
        process.terminate()
        await process.wait()
