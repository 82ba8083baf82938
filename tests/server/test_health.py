"""The health listener: /healthz, /readyz following the upstream, /metrics moving with requests."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer, resource_slice
from gatekeeper.cli.certs import create_ca, issue_client_cert, write_pem
from gatekeeper.cli.served import served_kinds
from gatekeeper.policy import Policy
from gatekeeper.server.config import AuditSettings
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    PKI,
    Running,
    metric_samples,
    metric_value,
    running_gatekeeper,
)

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = f"fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{GPU}"


async def get(running: Running, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{running.server.health_port}{path}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


@pytest.fixture
async def health(
    apiserver: APIServer, policy: Policy, pki: PKI, tmp_path: Path
) -> AsyncIterator[Running]:
    async with running_gatekeeper(
        apiserver,
        policy,
        pki,
        health_listen=("127.0.0.1", 0),
        readiness_cache=0.0,
        audit=AuditSettings(path=str(tmp_path / "audit.log")),
    ) as running:
        yield running


async def test_healthz_and_readyz(health: Running) -> None:
    assert await get(health, "/healthz") == (200, "ok")
    assert await get(health, "/readyz") == (200, "ok")


async def test_readiness_follows_the_upstream(
    policy: Policy, pki: PKI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gatekeeper.health")
    upstream = APIServer(served_kinds(policy), token=NODE_TOKEN)
    await upstream.start()
    port = int(upstream.url.rsplit(":", 1)[1])
    async with running_gatekeeper(
        upstream, policy, pki, health_listen=("127.0.0.1", 0), readiness_cache=0.0
    ) as running:
        assert (await get(running, "/readyz"))[0] == 200
        await upstream.close()
        status, text = await get(running, "/readyz")
        assert status == 503 and "upstream" in text and "unreachable" in text
        metrics = (await get(running, "/metrics"))[1]
        assert metric_value(metrics, "dra_gatekeeper_ready") == 0
        # Requests fail meanwhile (503); the probe says so before a driver finds out.
        async with running.unix_session(GPU) as session, session.get("/version") as response:
            assert response.status == 503
        back = APIServer(served_kinds(policy), token=NODE_TOKEN)
        await back.start(port=port)
        try:
            assert await get(running, "/readyz") == (200, "ok")
            assert metric_value((await get(running, "/metrics"))[1], "dra_gatekeeper_ready") == 1
        finally:
            await back.close()
    messages = [record.getMessage() for record in caplog.records]
    assert any(m.startswith("not ready: ") for m in messages)
    assert "upstream reachable again" in messages


async def test_readiness_caches_the_upstream_answer(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    async with running_gatekeeper(
        apiserver, policy, pki, health_listen=("127.0.0.1", 0), readiness_cache=3600.0
    ) as running:
        before = len(apiserver.journal)
        for _ in range(5):
            assert (await get(running, "/readyz"))[0] == 200
        probes = [r for r in apiserver.journal[before:] if r.path == "/version"]
        assert len(probes) == 1


async def test_metrics_move_with_requests(health: Running, apiserver: APIServer) -> None:
    apiserver.add(resource_slice(f"{NODE}-gpu-0", driver=GPU, node=NODE))
    first = (await get(health, "/metrics"))[1]
    labels = {"driver": GPU, "verb": "list", "resource": "resourceslices"}
    allowed = {**labels, "decision": "allow", "code": "200"}
    refused = {**labels, "decision": "forbid", "code": "403"}
    assert metric_value(first, "dra_gatekeeper_requests_total", **allowed) == 0
    async with health.unix_session(GPU) as session:
        for _ in range(3):
            async with session.get(f"{SLICES}?{PINNED}") as response:
                assert response.status == 200
        async with session.get(SLICES) as response:
            assert response.status == 403
    text = (await get(health, "/metrics"))[1]
    assert metric_value(text, "dra_gatekeeper_requests_total", **allowed) == 3
    assert metric_value(text, "dra_gatekeeper_requests_total", **refused) == 1
    refusals = [
        (name, dict(labels))
        for (name, labels), v in metric_samples(text).items()
        if name == "dra_gatekeeper_refusals_total" and v == 1
    ]
    assert len(refusals) == 1 and refusals[0][1]["driver"] == GPU
    count = metric_value(
        text, "dra_gatekeeper_upstream_request_duration_seconds_count", method="GET"
    )
    assert count >= 3
    assert metric_value(text, "dra_gatekeeper_audit_queue_depth") >= 0
    assert ("dra_gatekeeper_audit_write_errors_total", ()) in metric_samples(text)
    assert metric_value(text, "dra_gatekeeper_requests_in_flight", driver=GPU) == 0


async def test_open_watches_and_in_flight_per_driver(health: Running) -> None:
    async with health.unix_session(NIC) as session:
        selector = f"fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{NIC}"
        async with session.get(f"{SLICES}?{selector}&watch=true") as watch:
            assert watch.status == 200
            text = (await get(health, "/metrics"))[1]
            assert metric_value(text, "dra_gatekeeper_watches_open", driver=NIC) == 1
            assert metric_value(text, "dra_gatekeeper_requests_in_flight", driver=NIC) == 1
    for _ in range(100):
        text = (await get(health, "/metrics"))[1]
        if metric_value(text, "dra_gatekeeper_watches_open", driver=NIC) == 0:
            break
        await asyncio.sleep(0.05)
    assert metric_value(text, "dra_gatekeeper_watches_open", driver=NIC) == 0
    assert metric_value(text, "dra_gatekeeper_requests_in_flight", driver=NIC) == 0


async def test_client_certificate_from_another_ca_is_counted_and_logged_once(
    health: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gatekeeper.tls")
    other = create_ca("another-ca")
    stranger = issue_client_cert(other, GPU)
    write_pem(tmp_path / "c.crt", stranger.cert_pem)
    write_pem(tmp_path / "c.key", stranger.key_pem, private=True)
    context = ssl.create_default_context(cafile=health.pki.path("ca.crt"))
    context.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
    for _ in range(3):  # raw connections: an HTTP client may retry on its own
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", health.server.tls_port, ssl=context
        )
        writer.write(b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 10)
        except (ssl.SSLError, ConnectionError):
            answer = b""  # TLS 1.3: the server's alert arrives after the client's handshake
        assert answer == b""
        writer.close()
    text = ""
    for _ in range(100):  # the server counts when its side of the handshake ends
        text = (await get(health, "/metrics"))[1]
        failures = sum(
            v
            for (name, _), v in metric_samples(text).items()
            if name == "dra_gatekeeper_tls_handshake_failures_total"
        )
        if failures >= 3:
            break
        await asyncio.sleep(0.05)
    assert failures == 3, text
    lines = [r.getMessage() for r in caplog.records if "tls handshake failed" in r.getMessage()]
    assert len(lines) == 1 and "peer=127.0.0.1 reason=CERTIFICATE_VERIFY_FAILED" in lines[0]
    # A driver with a certificate from the right CA still gets in.
    async with health.tls_session(GPU) as session, session.get("/version") as response:
        assert response.status == 200
