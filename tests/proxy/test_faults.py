"""Faults, each with real sockets: the upstream down at start, restarted mid-watch, slow to
connect or to answer, answering garbage or a redirect; the policy file deleted; the audit log
unwritable. Every answer is a Status, and no driver waits on another's fault."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import JsonLinesWriter
from gatekeeper.cli.served import served_kinds
from gatekeeper.limits import Limits
from gatekeeper.policy import Policy
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PKI,
    RecordingSink,
    free_port,
    metric_value,
    running_gatekeeper,
)
from tests.paths import REPO

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = {"fieldSelector": f"spec.nodeName={NODE},spec.driver={GPU}"}
FAST = Limits(upstream_timeout=0.5, upstream_connect_timeout=0.5, upstream_wait=0.5)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def stub(handler: Handler) -> tuple[asyncio.Server, str]:
    """A raw TCP upstream on loopback that answers with ``handler``."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def status_of(session: aiohttp.ClientSession, path: str, **params: str) -> tuple[int, dict]:
    async with session.get(path, params=params) as response:
        body = await response.json(content_type=None)
        assert response.headers["Content-Type"].startswith("application/json")
        assert response.headers["Audit-Id"]
        return response.status, {"retry": response.headers.get("Retry-After"), **body}


async def test_upstream_down_at_start_then_recovers(policy: Policy, pki: PKI) -> None:
    port = free_port()
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    apiserver.url = f"http://127.0.0.1:{port}"  # nothing listens there yet
    async with (
        running_gatekeeper(apiserver, policy, pki, limits=FAST) as gk,
        gk.unix_session(GPU) as gpu,
    ):
        code, status = await status_of(gpu, "/version")
        assert code == 503 and status["retry"] == "1"
        assert "the upstream API server is unreachable" in status["message"]
        await apiserver.start(port=port)
        try:
            code, _ = await status_of(gpu, "/version")
            assert code == 200  # no restart of the gatekeeper needed
        finally:
            await apiserver.close()


async def test_upstream_restarted_mid_watch_ends_the_watch(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    port = int(apiserver.url.rsplit(":", 1)[1])
    async with running_gatekeeper(apiserver, policy, pki) as gk, gk.unix_session(GPU) as gpu:
        watch = await gpu.get(SLICES, params={**PINNED, "watch": "true"})
        assert watch.status == 200
        await apiserver.close()
        # The driver's stream ends (EOF or a broken connection), it does not hang: its
        # informer re-lists. (A hang would fail here with TimeoutError.)
        try:
            async with asyncio.timeout(30):
                while await watch.content.readline():
                    pass
        except aiohttp.ClientError:
            pass
        watch.release()
        restarted = APIServer(served_kinds(policy), token=NODE_TOKEN)
        await restarted.start(port=port)
        try:
            code, _ = await status_of(gpu, SLICES, **PINNED)
            assert code == 200
        finally:
            await restarted.close()


async def test_slow_upstream_is_504_and_other_drivers_are_served(policy: Policy, pki: PKI) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = await reader.readline()
        while (await reader.readline()).strip():
            pass
        if b"nic.example.com" in line:  # the other driver's requests are answered at once
            body = b'{"kind":"ResourceSliceList","apiVersion":"resource.k8s.io/v1","items":[]}'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode() + b"\r\n\r\n" + body
            )  # fmt: skip
            await writer.drain()
        else:
            await asyncio.sleep(30)  # never answers in time
        writer.close()

    server, url = await stub(handler)
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    apiserver.url = url
    nic_pinned = {"fieldSelector": f"spec.nodeName={NODE},spec.driver={NIC}"}
    try:
        async with (
            running_gatekeeper(apiserver, policy, pki, limits=FAST) as gk,
            gk.unix_session(GPU) as gpu,
            gk.unix_session(NIC) as nic,
        ):
            slow = asyncio.create_task(status_of(gpu, SLICES, **PINNED))
            code, _ = await status_of(nic, SLICES, **nic_pinned)
            assert code == 200 and not slow.done()
            code, status = await slow
            assert code == 504 and "did not answer in time" in status["message"]
    finally:
        server.close()


async def test_upstream_that_never_accepts_is_a_connect_timeout(policy: Policy, pki: PKI) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # a full backlog: further connections are never accepted
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(listener.getsockname())
        fillers.append(filler)
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    apiserver.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        async with (
            running_gatekeeper(apiserver, policy, pki, limits=FAST) as gk,
            gk.unix_session(GPU) as gpu,
        ):
            code, status = await status_of(gpu, "/version")
            assert code in (503, 504), status
    finally:
        for sock in [*fillers, listener]:
            sock.close()


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n", "upstream request failed"),
        (b"HTTP/1.1 302 Found\r\nLocation: http://evil.example/\r\nContent-Length: 0\r\n\r\n",
         "redirect"),
    ],
    ids=["garbage", "redirect"],
)  # fmt: skip
async def test_garbage_or_redirect_upstream_is_502(
    policy: Policy, pki: PKI, answer: bytes, message: str
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        writer.write(answer)
        await writer.drain()
        writer.close()

    server, url = await stub(handler)
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    apiserver.url = url
    try:
        async with (
            running_gatekeeper(apiserver, policy, pki, limits=FAST) as gk,
            gk.unix_session(GPU) as gpu,
        ):
            code, status = await status_of(gpu, "/version")
            assert code == 502 and message in status["message"]
    finally:
        server.close()


async def test_deleted_policy_file_keeps_the_last_good_policy(
    apiserver: APIServer, pki: PKI, tmp_path: Path
) -> None:
    policy_file = tmp_path / "policy.yaml"
    default = REPO / "gatekeeper" / "policies" / "default.yaml"
    policy_file.write_text(default.read_text().replace("drivers: []", f"drivers: [{GPU}]"))
    policy = load_policy(str(policy_file))
    async with (
        running_gatekeeper(apiserver, policy, pki, policy_path=str(policy_file)) as gk,
        gk.unix_session(GPU) as gpu,
    ):
        policy_file.unlink()
        await gk.server.reloader.reload()
        assert gk.server.engine.policy.drivers == frozenset({GPU})
        code, _ = await status_of(gpu, SLICES, **PINNED)
        assert code == 200
        # The refused reload is counted: a reload that silently kept nothing would not be.
        text = gk.server.metrics.render().decode()
        refused = {"file": "policy", "result": "error"}
        assert metric_value(text, "dra_gatekeeper_reloads_total", **refused) == 1
        assert metric_value(text, "dra_gatekeeper_reloads_total", file="policy", result="ok") == 0


async def test_unwritable_audit_log_refuses_requests_rather_than_serve_them_unaudited(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full to make every write fail with ENOSPC")
    writer = JsonLinesWriter("/dev/full", close_timeout=0.5)
    async with (
        running_gatekeeper(apiserver, policy, pki, audit_sink=writer) as gk,
        gk.unix_session(GPU) as gpu,
    ):
        await status_of(gpu, "/version")  # its event is the first write that fails
        async with asyncio.timeout(20):
            while writer.writable:
                await asyncio.sleep(0.05)
        before = len(apiserver.journal)
        code, status = await status_of(gpu, SLICES, **PINNED)
        assert code == 503 and status["retry"] == "5"
        assert "cannot write its audit log" in status["message"]
        assert len(apiserver.journal) == before  # nothing forwarded unaudited


async def test_a_sink_that_cannot_write_refuses_every_request_on_every_listener(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """``writable`` is the sink's own answer (its Protocol), read as is: False refuses with
    503 on the Unix socket and over mTLS, and nothing reaches the upstream; True serves."""
    sink = RecordingSink()
    sink.writable = False
    async with running_gatekeeper(apiserver, policy, pki, audit_sink=sink) as gk:
        before = len(apiserver.journal)
        async with gk.unix_session(GPU) as gpu, gk.tls_session(NIC) as nic:
            for session in (gpu, nic):
                for path in ("/version", SLICES):
                    code, status = await status_of(session, path, **PINNED)
                    assert code == 503 and status["retry"] == "5", status
                    assert "cannot write its audit log" in status["message"]
            assert len(apiserver.journal) == before  # nothing forwarded unaudited
            refusals = [e for e in sink.events if e["responseStatus"]["code"] == 503]
            assert len(refusals) == 4  # each still offered to the sink
            sink.writable = True
            code, _ = await status_of(gpu, SLICES, **PINNED)
            assert code == 200


async def test_a_sink_that_does_not_say_whether_it_can_write_fails_closed(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """A sink missing ``writable`` (outside the Protocol, which mypy checks for the product's
    own sinks) is never taken as writable: the request fails, nothing is forwarded."""

    class Unsaid:
        def __init__(self) -> None:
            self.events: list[dict[str, Any]] = []

        async def emit(self, event: dict[str, Any]) -> None:
            self.events.append(event)

        def close(self) -> None:
            return None

        async def aclose(self) -> None:
            return None

    sink = Unsaid()
    async with (
        running_gatekeeper(apiserver, policy, pki, audit_sink=sink) as gk,
        gk.unix_session(GPU) as gpu,
    ):
        before = len(apiserver.journal)
        code, status = await status_of(gpu, SLICES, **PINNED)
        assert code == 500 and status["kind"] == "Status"
        assert len(apiserver.journal) == before
        assert [e["responseStatus"]["code"] for e in sink.events] == [500]
