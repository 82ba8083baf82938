"""The signer's CA against the embedded API server over HTTP: made once at the first start into
the (empty) Secret, read back the same after, its certificates (never its key) published in the
ConfigMap, with the next CA beside it during a rotation; a missing or broken Secret is one line."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import pytest
from cryptography import x509

from gatekeeper.apiserver import APIServer, ServedKind
from gatekeeper.codec import pki
from gatekeeper.errors import ConfigError, UpstreamError
from gatekeeper.signer import (
    CA_CERT,
    CA_KEY,
    TRUST_CERT,
    HeldCA,
    load_ca,
    publish_certificates,
)
from gatekeeper.testing.harness import NODE_TOKEN
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import UpstreamSession, request

SECRETS = ServedKind("", "secrets", "Secret", True, ("v1",))
CONFIGMAPS = ServedKind("", "configmaps", "ConfigMap", True, ("v1",))
NS = "kube-system"


@pytest.fixture
async def api() -> AsyncIterator[APIServer]:
    server = APIServer((SECRETS, CONFIGMAPS), token=NODE_TOKEN)
    await server.start()
    for kind in ("Secret", "ConfigMap"):  # as the chart makes them: empty
        server.add({"apiVersion": "v1", "kind": kind, "metadata": {"name": "ca", "namespace": NS}})
    yield server
    await server.close()


async def put_secret(upstream: UpstreamSession, data: dict[str, bytes]) -> None:
    """Write the Secret's data as an admin would (kubectl edit)."""
    path = f"/api/v1/namespaces/{NS}/secrets/ca"
    _, stored = await request(upstream, "GET", path)
    stored["data"] = {key: base64.b64encode(value).decode() for key, value in data.items()}
    code, _ = await request(upstream, "PUT", path, stored)
    assert code == 200


@pytest.fixture
async def upstream(api: APIServer) -> AsyncIterator[UpstreamSession]:
    session = UpstreamSession(UpstreamConfig(server=api.url, token=NODE_TOKEN))
    await session.start()
    yield session
    await session.close()


async def test_made_once_then_read_back_and_only_certificates_published(
    api: APIServer, upstream: UpstreamSession
) -> None:
    made = await load_ca(upstream, NS, "ca", days=30, common_name="test CA")
    stored = api.get("", "secrets", "ca", namespace=NS)
    assert stored is not None and set(stored["data"]) == {CA_CERT, CA_KEY}
    assert pki.is_ca(made.ca.certificate)
    again = await load_ca(upstream, NS, "ca", days=30, common_name="test CA")
    assert again.ca == made.ca and again.version == made.version
    assert await publish_certificates(upstream, NS, "ca", again) is True
    assert await publish_certificates(upstream, NS, "ca", again) is False  # current already
    published = api.get("", "configmaps", "ca", namespace=NS)
    assert published is not None and published["data"] == {CA_CERT: made.ca.cert_pem.decode()}
    assert "PRIVATE KEY" not in str(published)


async def test_during_a_rotation_both_are_published(
    api: APIServer, upstream: UpstreamSession
) -> None:
    current, following = pki.create_ca("current"), pki.create_ca("next")
    await put_secret(
        upstream,
        {CA_CERT: current.cert_pem, CA_KEY: current.key_pem, TRUST_CERT: following.cert_pem},
    )
    held = await load_ca(upstream, NS, "ca", days=30, common_name="unused")
    assert held.ca.cert_pem == current.cert_pem and held.trust == following.cert_pem
    await publish_certificates(upstream, NS, "ca", held)
    published = api.get("", "configmaps", "ca", namespace=NS)
    assert published is not None
    bundle = "".join(published["data"].values()).encode()
    assert len(x509.load_pem_x509_certificates(bundle)) == 2


async def test_a_missing_or_broken_secret_is_one_line(
    api: APIServer, upstream: UpstreamSession
) -> None:
    with pytest.raises(ConfigError, match="Secret kube-system/gone does not exist: the chart"):
        await load_ca(upstream, NS, "gone", days=30, common_name="x")
    await put_secret(upstream, {CA_CERT: b"nonsense"})
    with pytest.raises(ConfigError, match="Secret kube-system/ca: not a PEM certificate"):
        await load_ca(upstream, NS, "ca", days=30, common_name="x")
    held = pki.create_ca("x")
    with pytest.raises(UpstreamError, match="ConfigMap kube-system/gone: HTTP 404"):
        await publish_certificates(upstream, NS, "gone", HeldCA(held, b"", "1"))
