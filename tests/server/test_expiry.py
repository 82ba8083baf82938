"""Certificates close to expiry: drivers' client certificates seen on the mTLS listener."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.cli.certs import issue_client_cert, write_pem
from gatekeeper.policy import Policy
from gatekeeper.server.expiry import CertificateExpiry
from gatekeeper.server.metrics import Metrics
from gatekeeper.testing.harness import GPU, PKI, metric_value, running_gatekeeper

DAY = 86400.0


async def test_a_driver_certificate_close_to_expiry_is_logged_once_and_exported(
    apiserver: APIServer, policy: Policy, pki: PKI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gatekeeper.expiry")
    short = issue_client_cert(pki.ca, GPU, days=2)
    write_pem(tmp_path / "gpu.crt", short.cert_pem)
    write_pem(tmp_path / "gpu.key", short.key_pem, private=True)
    context = ssl.create_default_context(cafile=pki.path("ca.crt"))
    context.load_cert_chain(tmp_path / "gpu.crt", tmp_path / "gpu.key")
    async with running_gatekeeper(apiserver, policy, pki, cert_expiry_warning=7 * DAY) as running:
        connector = aiohttp.TCPConnector(ssl=context)
        async with aiohttp.ClientSession(running.tls_url, connector=connector) as session:
            for _ in range(3):
                async with session.get("/version") as response:
                    assert response.status == 200
        text = running.server.metrics.render().decode()
    assert (
        metric_value(text, "dra_gatekeeper_certificate_expiring", certificate=f"client:{GPU}") == 1
    )
    left = metric_value(
        text, "dra_gatekeeper_certificate_expiry_seconds", certificate=f"client:{GPU}"
    )
    assert DAY < left <= 2 * DAY
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [warnings[0]] and warnings[0].startswith(
        f"client certificate expires soon driver={GPU} not_after="
    )


def test_client_certificates_far_from_expiry_are_exported_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gatekeeper.expiry")
    metrics = Metrics()
    now = ssl.cert_time_to_seconds("Jan  1 00:00:00 2030 GMT")
    expiry = CertificateExpiry(metrics, 30 * DAY, clock=lambda: now)
    expiry.observe_client("a.example", "Jun  1 00:00:00 2030 GMT")
    expiry.observe_client("b.example", "Jan 10 00:00:00 2030 GMT")
    expiry.observe_client("b.example", "Jan 10 00:00:00 2030 GMT")
    expiry.observe_client("c.example", "not a time")
    text = metrics.render().decode()
    assert (
        metric_value(text, "dra_gatekeeper_certificate_expiring", certificate="client:a.example")
        == 0
    )
    assert (
        metric_value(text, "dra_gatekeeper_certificate_expiring", certificate="client:b.example")
        == 1
    )
    assert (
        metric_value(
            text, "dra_gatekeeper_certificate_expiry_seconds", certificate="client:b.example"
        )
        == 9 * DAY
    )
    assert [r.getMessage() for r in caplog.records] == [
        "client certificate expires soon driver=b.example not_after=2030-01-10T00:00:00+00:00"
    ]
