"""Fixtures for the embedded API server tests: a running server, a client, throwaway TLS files."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gatekeeper.apiserver import DRA_KINDS, APIServer, ServedKind

NODES = ServedKind("", "nodes", "Node", False, ("v1",), short_names=("no",))
KINDS: tuple[ServedKind, ...] = (*DRA_KINDS, NODES)
TOKEN = "test-token"


@pytest.fixture
async def server() -> AsyncIterator[APIServer]:
    """A started server for DRA kinds and nodes, requiring ``TOKEN``."""
    api = APIServer(KINDS, token=TOKEN)
    api.rv_wait_seconds = 0.2
    api.bookmark_interval = 0.2
    await api.start()
    yield api
    await api.close()


@pytest.fixture
async def client(server: APIServer) -> AsyncIterator[aiohttp.ClientSession]:
    """A session authenticated to ``server`` with ``base_url`` set."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(base_url=server.url, headers=headers) as session:
        yield session


@dataclass(frozen=True)
class TLSFiles:
    """A throwaway CA, a server certificate for 127.0.0.1, and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_client_cert: Path
    other_client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    server: bool = False,
    client: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if server:
        san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@pytest.fixture
def tls_files(tmp_path: Path) -> TLSFiles:
    """Generate a CA plus server and client certificates into ``tmp_path``."""
    ca_key = _key()
    ca = _cert("embedded-apiserver-test-ca", ca_key, None)
    _write(tmp_path / "ca.crt", ca, ca_key)
    server_key, client_key, other_key = _key(), _key(), _key()
    _write(
        tmp_path / "server.crt",
        _cert("127.0.0.1", server_key, (ca, ca_key), server=True),
        server_key,
    )
    _write(
        tmp_path / "client.crt", _cert("admin", client_key, (ca, ca_key), client=True), client_key
    )
    other_ca_key = _key()
    other_ca = _cert("another-ca", other_ca_key, None)
    _write(
        tmp_path / "other.crt",
        _cert("intruder", other_key, (other_ca, other_ca_key), client=True),
        other_key,
    )
    return TLSFiles(
        ca=tmp_path / "ca.crt",
        server_cert=tmp_path / "server.crt",
        server_key=tmp_path / "server.key",
        client_cert=tmp_path / "client.crt",
        client_key=tmp_path / "client.key",
        other_client_cert=tmp_path / "other.crt",
        other_client_key=tmp_path / "other.key",
    )
