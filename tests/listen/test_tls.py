"""The mTLS listener's context: loading its files with messages naming the flag, changes seen,
reloads applied to the next handshake."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from gatekeeper.cli.certs import create_ca, issue_client_cert, issue_server_cert, write_pem
from gatekeeper.errors import ConfigError
from gatekeeper.listen.tls import ServerTLS, TLSFiles, file_identity
from gatekeeper.testing.harness import PKI


def files(pki: PKI, **overrides: str) -> TLSFiles:
    paths = {
        "cert_file": pki.path("server.crt"),
        "key_file": pki.path("server.key"),
        "client_ca_file": pki.path("ca.crt"),
    }
    paths.update(overrides)
    return TLSFiles(**paths)


@pytest.mark.parametrize(
    ("which", "flag"),
    [
        ("cert_file", "--tls-cert-file"),
        ("key_file", "--tls-key-file"),
        ("client_ca_file", "--client-ca-file"),
    ],
)
def test_unloadable_file_names_the_flag_and_file(
    pki: PKI, tmp_path: Path, which: str, flag: str
) -> None:
    missing = str(tmp_path / "missing.pem")
    with pytest.raises(ConfigError) as caught:
        ServerTLS.load(files(pki, **{which: missing}))
    assert flag in str(caught.value) and missing in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_missing_file_is_named_alone(pki: PKI, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.crt")
    with pytest.raises(ConfigError) as caught:
        ServerTLS.load(files(pki, cert_file=missing))
    assert str(caught.value) == f"--tls-cert-file {missing}: cannot read: No such file or directory"


@pytest.mark.parametrize(
    ("cert", "key", "message"),
    [
        (
            "server.key",
            "server.crt",
            "certificate and key do not match (the two files are swapped)",
        ),
        ("server.crt", "client", "certificate and key do not match"),
        ("ca.crt", "server.key", "certificate and key do not match"),
    ],
    ids=["swapped", "another-key", "another-certificate"],
)
def test_a_pair_that_does_not_match_says_so(pki: PKI, cert: str, key: str, message: str) -> None:
    key_file = pki.client_files("gpu.example.com")[1] if key == "client" else pki.path(key)
    cert_file = pki.path(cert)
    with pytest.raises(ConfigError) as caught:
        ServerTLS.load(files(pki, cert_file=cert_file, key_file=key_file))
    assert (
        str(caught.value) == f"--tls-cert-file {cert_file} / --tls-key-file {key_file}: {message}"
    )


def test_changes_are_seen_through_symlinks(pki: PKI, tmp_path: Path) -> None:
    first = tmp_path / "a.crt"
    first.write_bytes(Path(pki.path("ca.crt")).read_bytes())
    link = tmp_path / "ca.crt"
    os.symlink(first.name, link)
    tls = ServerTLS.load(files(pki, client_ca_file=str(link)))
    assert not tls.changed()
    second = tmp_path / "b.crt"
    second.write_bytes(first.read_bytes())
    os.symlink(second.name, tmp_path / "tmp-link")
    os.replace(tmp_path / "tmp-link", link)
    assert tls.changed() and file_identity(str(link)) == file_identity(str(second))
    tls.reload()
    assert not tls.changed()
    assert file_identity(str(tmp_path / "none")) is None


async def _handshake(port: int, client: ssl.SSLContext, server_hostname: str | None) -> str:
    """The issuer CN of the certificate the listener served, or "refused" when the listener
    refused the client's certificate (TLS 1.3: seen on the first read)."""
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname=server_hostname
        )
    except (ssl.SSLError, ConnectionError):
        return "refused"
    try:
        served = x509.load_der_x509_certificate(
            writer.get_extra_info("ssl_object").getpeercert(True)
        )
        writer.write(b"ping")
        if await reader.read(4) != b"pong":
            return "refused"
        (name,) = served.issuer.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        return str(name.value)
    except (ssl.SSLError, ConnectionError):
        return "refused"
    finally:
        writer.close()


@pytest.mark.parametrize("server_hostname", ["", "localhost"], ids=["no-sni", "sni"])
async def test_a_reload_applies_to_the_next_handshake(tmp_path: Path, server_hostname: str) -> None:
    """Canary for ssl's ``sni_callback`` (ServerTLS switches each handshake to the context of the
    last reload there): it must run for clients that send no server name too (an address),
    and the switch must bring the new serving certificate and the new client CA. If this fails
    after a Python or OpenSSL upgrade, re-check ``ServerTLS._choose``."""
    cas = {stem: create_ca(f"{stem}-ca") for stem in ("old", "new")}
    clients: dict[str, ssl.SSLContext] = {}
    for stem, ca in cas.items():
        served, client = issue_server_cert(ca), issue_client_cert(ca, "gpu.example.com")
        for name, data in (("ca.crt", ca.cert_pem), ("server.crt", served.cert_pem),
                           ("server.key", served.key_pem), ("client.crt", client.cert_pem),
                           ("client.key", client.key_pem)):  # fmt: skip
            write_pem(tmp_path / f"{stem}-{name}", data)
    for stem in cas:
        context = ssl.create_default_context(cafile=tmp_path / "old-ca.crt")
        context.load_verify_locations(cafile=tmp_path / "new-ca.crt")
        context.check_hostname = False  # the served certificate's issuer is what is checked
        context.load_cert_chain(tmp_path / f"{stem}-client.crt", tmp_path / f"{stem}-client.key")
        clients[stem] = context
    live = [tmp_path / name for name in ("server.crt", "server.key", "ca.crt")]
    for path in live:
        path.write_bytes((tmp_path / f"old-{path.name}").read_bytes())
    tls = ServerTLS.load(TLSFiles(*(str(path) for path in live)))

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            if await reader.read(4) == b"ping":
                writer.write(b"pong")
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=tls.context)
    port = server.sockets[0].getsockname()[1]
    name = server_hostname or None
    try:
        assert await _handshake(port, clients["old"], name) == "old-ca"
        assert await _handshake(port, clients["new"], name) == "refused"
        for path in live:
            path.write_bytes((tmp_path / f"new-{path.name}").read_bytes())
        assert tls.changed()
        tls.reload()
        assert await _handshake(port, clients["new"], name) == "new-ca"
        assert await _handshake(port, clients["old"], name) == "refused"
    finally:
        server.close()
        await server.wait_closed()
