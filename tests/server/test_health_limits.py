"""The health listener's limits, attacked over real sockets: anyone who reaches the port can
connect, so it holds at most its cap of connections, closes those that send nothing, never takes
a descriptor the drivers need, and answers any number of scrapers with a bounded number of
renders."""

from __future__ import annotations

import asyncio
import os
import resource
import socket
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gatekeeper.apiserver import APIServer
from gatekeeper.limits import Limits
from gatekeeper.listen.capacity import UNAUTHENTICATED
from gatekeeper.policy import Policy
from gatekeeper.server.health import HealthServer, Readiness, health_server
from gatekeeper.server.metrics import SCRAPE_INTERVAL, Metrics
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    PKI,
    SERVE,
    Running,
    free_port,
    metric_value,
    running_gatekeeper,
    token_kubeconfig,
    wait_ready,
)
from tests.rawhttp import build_request, send_raw

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _until(check: Callable[[], bool], seconds: float = 30) -> None:
    """Poll state until ``check`` holds (bounded)."""
    async with asyncio.timeout(seconds):
        while not check():
            await asyncio.sleep(0.01)


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection: EOF (or a reset) within a generous bound."""
    try:
        return await asyncio.wait_for(reader.read(), 20) == b""
    except ConnectionError:
        return True


async def _get(port: int, path: str) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}{path}") as response,
    ):
        return response.status, await response.text()


@pytest.fixture
async def capped(apiserver: APIServer, policy: Policy, pki: PKI) -> AsyncIterator[Running]:
    limits = Limits(health_connections=4)
    async with running_gatekeeper(
        apiserver, policy, pki, health_listen=("127.0.0.1", 0), limits=limits
    ) as running:
        yield running


def _health(running: Running) -> tuple[HealthServer, int]:
    health, port = running.server.health, running.server.health_port
    assert health is not None and port is not None
    return health, port


async def test_a_connection_past_the_cap_closes_the_oldest_idle_one(capped: Running) -> None:
    health, port = _health(capped)
    idle: list[Connection] = []
    for count in range(1, 5):
        idle.append(await asyncio.open_connection("127.0.0.1", port))
        await _until(lambda n=count: health.held == n)  # type: ignore[misc]
    newest = await asyncio.open_connection("127.0.0.1", port)
    assert await _closed(idle[0][0])  # the oldest made room
    assert health.held == 4 and health.closed_over_cap == 1
    # A probe still gets in (the next oldest makes room), and its answer is complete.
    assert await _get(port, "/healthz") == (200, "ok")
    assert await _closed(idle[1][0])
    # The probe's connection is gone: the scrape finds room without closing another.
    status, text = await _get(port, "/metrics")
    assert status == 200
    closed = {"listener": "health", "caller": UNAUTHENTICATED}
    assert metric_value(text, "dra_gatekeeper_connections_refused_total", **closed) == 2
    assert metric_value(text, "dra_gatekeeper_connections_open", **closed) == 4
    for _, writer in [*idle, newest]:
        writer.close()


async def test_a_connection_being_answered_is_never_the_one_closed() -> None:
    """A ``/readyz`` waiting for the upstream's answer keeps its connection; the idle ones
    make room, the newest last."""
    answer, asked = asyncio.Event(), asyncio.Event()

    async def probe() -> str | None:
        asked.set()
        await answer.wait()
        return None

    readiness = Readiness(probe, lambda: True, ttl=0)
    server = health_server(readiness, Metrics(), Limits(health_connections=2))
    runner = web.ServerRunner(server)
    await runner.setup()
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    await web.SockSite(runner, listening).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(build_request("GET", "/readyz"))
        await _until(asked.is_set)
        idle = await asyncio.open_connection("127.0.0.1", port)
        await _until(lambda: server.held == 2)
        third = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed(idle[0])
        fourth = await asyncio.open_connection("127.0.0.1", port)
        assert await _closed(third[0])  # the oldest idle now; the one being answered stays
        answer.set()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        assert head.startswith(b"HTTP/1.1 200")
        for stream in (writer, idle[1], third[1], fourth[1]):
            stream.close()
    finally:
        await runner.cleanup()
        listening.close()


async def test_connections_that_send_no_request_in_time_are_closed(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """Idle from the start, headers never finished, idle after an answer: each is closed by
    the header timeout (0.3 s here), well before the generous bound of the test."""
    limits = Limits(header_timeout=0.3)
    async with running_gatekeeper(
        apiserver, policy, pki, health_listen=("127.0.0.1", 0), limits=limits
    ) as running:
        health, port = _health(running)
        silent = await asyncio.open_connection("127.0.0.1", port)
        slow = await asyncio.open_connection("127.0.0.1", port)
        slow[1].write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        answered = await asyncio.open_connection("127.0.0.1", port)
        answered[1].write(build_request("GET", "/healthz"))
        head = await asyncio.wait_for(answered[0].readuntil(b"\r\n\r\nok"), 20)
        assert head.startswith(b"HTTP/1.1 200")
        for reader, writer in (silent, slow, answered):
            assert await _closed(reader)
            writer.close()
        await _until(lambda: health.held == 0)


async def test_scrapers_share_renders_and_see_what_came_before(
    health_port_metrics: Running,
) -> None:
    """60 clients scraping back to back cost one render per interval, not one per scrape; and
    a scrape still shows everything counted before it arrived."""
    running = health_port_metrics
    _, port = _health(running)
    exposition = running.server.metrics.exposition
    loop = asyncio.get_running_loop()
    answers: list[int] = []

    async def scraper(session: aiohttp.ClientSession) -> None:
        for _ in range(5):
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                await response.read()
                answers.append(response.status)

    renders, began = exposition.renders, loop.time()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(scraper(session) for _ in range(60)))
    renders, elapsed = exposition.renders - renders, loop.time() - began
    assert answers == [200] * 300
    assert renders <= elapsed / SCRAPE_INTERVAL + 2
    assert renders <= 300 / 30  # each render answered 30 scrapes at least
    running.server.metrics.ready.set(7)  # counted just after a render: the next scrape has it
    assert metric_value((await _get(port, "/metrics"))[1], "dra_gatekeeper_ready") == 7


@pytest.fixture
async def health_port_metrics(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> AsyncIterator[Running]:
    async with running_gatekeeper(
        apiserver, policy, pki, health_listen=("127.0.0.1", 0)
    ) as running:
        yield running


# --- a served process at 1,024 descriptors -----------------------------------------------

IDLE = 1100
DESCRIPTORS = 1024
BATCH = 32
"""Connections opened at once: fewer than the listen backlog (the cap), so that the kernel never
drops one (a dropped handshake leaves the client's end waiting for ever)."""


def _descriptors_at_1024() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))


def _descriptors_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _held_on(pid: int, port: int) -> int:
    """The established TCP connections on local ``port`` that process ``pid`` holds open: its
    socket descriptors matched by inode with the kernel's table. Counting these, not all its
    descriptors, keeps a readiness probe's connection or an upstream one closing meanwhile
    from moving the count."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed while we looked
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    held = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            established = state == "01"
            held += established and int(local.rsplit(":", 1)[1], 16) == port and inode in inodes
    return held


def _taken(pid: int, port: int, opened: int, held: list[Connection], cap: int) -> bool:
    """Whether the gatekeeper took every connection ``opened`` (the cap's worth held) and
    closed one for each past its cap."""
    kept = sum(not reader.at_eof() for reader, _ in held)
    return _held_on(pid, port) == min(opened, cap) and kept <= cap


async def test_idle_health_connections_never_take_the_drivers_descriptors(
    apiserver: APIServer, pki: PKI, tmp_path: Path
) -> None:
    """The finding as reported: a ``serve`` process with 1,024 descriptors, 1,100 idle
    connections to its health port. It holds at most its cap of them and closes the others as
    they come; the drivers' requests on their Unix socket and over mTLS are answered while the
    cap's worth is held, and so is a probe."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE + 256:
        pytest.skip(f"this test opens {IDLE} connections; RLIMIT_NOFILE allows {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, IDLE + 256), hard))
    sockets, health, port = tmp_path / "s", free_port(), free_port()
    process = await asyncio.create_subprocess_exec(
        *SERVE,
        *("--node-name", "node-a", "--driver", GPU, "--driver", NIC),
        *("--socket-dir", str(sockets), "--health-listen", f"127.0.0.1:{health}"),
        *("--kubeconfig", token_kubeconfig(tmp_path / "kc", apiserver.url)),
        *("--listen", f"127.0.0.1:{port}", "--client-ca-file", pki.path("ca.crt")),
        *("--tls-cert-file", pki.path("server.crt"), "--tls-key-file", pki.path("server.key")),
        *("--header-timeout", "120"),  # the idle connections stay until the test ends
        stderr=asyncio.subprocess.DEVNULL,
        preexec_fn=_descriptors_at_1024,
    )
    cap = Limits().health_connections
    held: list[Connection] = []
    closed = 0
    try:
        await wait_ready(health)
        base = _descriptors_of(process.pid)
        for _ in range(IDLE // BATCH + 1):
            held += await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", health) for _ in range(BATCH))
            )
            opened = len(held) + closed
            await _until(partial(_taken, process.pid, health, opened, held, cap))
            for reader, writer in [c for c in held if c[0].at_eof()]:
                writer.close()
                held.remove((reader, writer))
                closed += 1
        assert closed + len(held) >= IDLE and len(held) == cap
        assert _descriptors_of(process.pid) <= base + cap
        for driver in (GPU, NIC):
            served = await send_raw(sockets / driver / "api.sock", build_request("GET", "/version"))
            assert served.status == 200
            async with aiohttp.ClientSession() as session:
                tls = pki.client_context(driver)
                url = f"https://127.0.0.1:{port}/version"
                async with session.get(url, ssl=tls) as response:
                    assert response.status == 200
        assert await _get(health, "/healthz") == (200, "ok")  # a probe gets in
        status, text = await _get(health, "/metrics")
        assert status == 200
        held_label = {"listener": "health", "caller": UNAUTHENTICATED}
        assert metric_value(text, "dra_gatekeeper_connections_open", **held_label) <= cap
        refused = metric_value(text, "dra_gatekeeper_connections_refused_total", **held_label)
        assert refused >= closed
    finally:
        for _, writer in held:
            writer.close()
        process.terminate()
        await process.wait()
