"""Tests for gatekeeper.cli.certs: the throwaway PKI and the `certs` subcommand."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, load_pem_private_key
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import DNSName, IPAddress, PolicyBuilder, Store

from gatekeeper.cli import certs
from gatekeeper.cli.certs import (
    IssuedCert,
    certificate_expiry,
    create_ca,
    issue_client_cert,
    issue_server_cert,
    load_ca,
    run_certs_command,
    write_pem,
)
from gatekeeper.errors import ConfigError
from gatekeeper.listen.identity import client_cert_common_name


@pytest.fixture(scope="module")
def ca() -> IssuedCert:
    return create_ca()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _ext(cert: x509.Certificate, cls: type) -> x509.ExtensionType:
    return cert.extensions.get_extension_for_class(cls).value


def test_all_names_exist() -> None:
    assert all(hasattr(certs, name) for name in certs.__all__)


# --- issuing ---------------------------------------------------------------------------------


def test_ca_is_a_self_signed_p256_ca(ca: IssuedCert) -> None:
    cert = ca.certificate
    cert.verify_directly_issued_by(cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "dra-gatekeeper-ca"
    assert _ext(cert, x509.BasicConstraints).ca is True
    assert _ext(cert, x509.KeyUsage).key_cert_sign is True
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    assert key.curve.name == "secp256r1"


def test_issued_cert_repr_hides_the_key(ca: IssuedCert) -> None:
    assert b"PRIVATE KEY" in ca.key_pem
    assert "PRIVATE" not in repr(ca)
    assert "key_pem" not in repr(ca)


def test_client_cert_is_signed_by_ca_with_client_auth_only(ca: IssuedCert) -> None:
    cert = issue_client_cert(ca, "gpu.example.com", days=2).certificate
    cert.verify_directly_issued_by(ca.certificate)
    assert client_cert_common_name(cert.public_bytes(Encoding.DER)) == "gpu.example.com"
    assert list(_ext(cert, x509.ExtendedKeyUsage)) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert _ext(cert, x509.BasicConstraints).ca is False
    assert _ext(cert, x509.KeyUsage).key_cert_sign is False
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 2 * 86400 <= lifetime.total_seconds() <= 2 * 86400 + 600


@pytest.mark.parametrize(
    "name",
    [
        DNSName("localhost"),
        IPAddress(ipaddress.ip_address("127.0.0.1")),
        IPAddress(ipaddress.ip_address("::1")),
    ],
    ids=["localhost", "ipv4", "ipv6"],
)
def test_server_cert_verifies_for_each_default_host(ca: IssuedCert, name: object) -> None:
    cert = issue_server_cert(ca).certificate
    verifier = PolicyBuilder().store(Store([ca.certificate])).build_server_verifier(name)
    verifier.verify(cert, [])  # raises VerificationError if not
    assert list(_ext(cert, x509.ExtendedKeyUsage)) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_server_cert_sans_are_ip_or_dns(ca: IssuedCert) -> None:
    cert = issue_server_cert(ca, ["10.1.2.3", "gk.example.com"]).certificate
    san = _ext(cert, x509.SubjectAlternativeName)
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    assert san.get_values_for_type(x509.DNSName) == ["gk.example.com"]


def test_server_cert_does_not_verify_for_other_hosts(ca: IssuedCert) -> None:
    cert = issue_server_cert(ca, ["127.0.0.1"]).certificate
    verifier = (
        PolicyBuilder()
        .store(Store([ca.certificate]))
        .build_server_verifier(DNSName("evil.example.com"))
    )
    with pytest.raises(Exception, match="validation failed"):
        verifier.verify(cert, [])


@pytest.mark.parametrize("hosts", [[], ["bad host"], ["-x.example"], "localhost"])
def test_server_cert_refuses_bad_hosts(ca: IssuedCert, hosts: object) -> None:
    with pytest.raises(ValueError):
        issue_server_cert(ca, hosts)  # type: ignore[arg-type]


def test_days_must_be_positive(ca: IssuedCert) -> None:
    with pytest.raises(ValueError):
        issue_client_cert(ca, "d", days=0)


# --- files -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("private", "mode"), [(True, 0o600), (False, 0o644)])
def test_write_pem_modes(tmp_path: Path, private: bool, mode: int) -> None:
    path = tmp_path / "f.pem"
    path.write_bytes(b"old")
    path.chmod(0o666)
    write_pem(path, b"new", private=private)
    assert path.read_bytes() == b"new"
    assert _mode(path) == mode
    assert [p.name for p in tmp_path.iterdir()] == ["f.pem"]  # no temp file left


def test_write_pem_replaces_a_symlink_instead_of_following_it(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"keep me")
    link = tmp_path / "key.pem"
    link.symlink_to(target)
    write_pem(link, b"secret", private=True)
    assert target.read_bytes() == b"keep me"
    assert not link.is_symlink()
    assert link.read_bytes() == b"secret"
    assert _mode(link) == 0o600


def test_load_ca_round_trip(tmp_path: Path, ca: IssuedCert) -> None:
    write_pem(tmp_path / "ca.crt", ca.cert_pem)
    write_pem(tmp_path / "ca.key", ca.key_pem, private=True)
    assert load_ca(tmp_path / "ca.crt", tmp_path / "ca.key") == ca


@pytest.mark.parametrize(
    ("cert", "key", "fragment"),
    [
        (None, "ca", "ca.crt: cannot read"),
        ("garbage", "ca", "ca.crt: not a PEM certificate"),
        ("ca", "garbage", "ca.key: not an unencrypted PEM EC private key"),
        ("leaf", "leaf", "ca.crt: not a CA certificate"),
        ("ca", "other", "ca.key: key does not match"),
    ],
)
def test_load_ca_refusals(
    tmp_path: Path, ca: IssuedCert, cert: str | None, key: str, fragment: str
) -> None:
    leaf = issue_client_cert(ca, "d")
    other = create_ca("other")
    pems = {
        "ca": ca,
        "leaf": leaf,
        "other": other,
        "garbage": IssuedCert(b"garbage", b"garbage"),
    }
    if cert is not None:
        (tmp_path / "ca.crt").write_bytes(pems[cert].cert_pem)
    (tmp_path / "ca.key").write_bytes(pems[key].key_pem)
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        load_ca(tmp_path / "ca.crt", tmp_path / "ca.key")


# --- peer identity ---------------------------------------------------------------------------


def _subject(*pairs: tuple[str, str]) -> dict:
    return {"subject": tuple(((k, v),) for k, v in pairs)}


@pytest.mark.parametrize(
    ("peercert", "expected"),
    [
        (None, None),
        ({}, None),
        (b"", None),
        (b"not der", None),
        (_subject(("commonName", "gpu.example.com")), "gpu.example.com"),
        (_subject(("organizationName", "o"), ("commonName", "nic.example.com")), "nic.example.com"),
        (_subject(("organizationName", "o")), None),
        (_subject(("commonName", "a"), ("commonName", "b")), None),
        (_subject(("commonName", "")), None),
    ],
    ids=[
        "none",
        "empty-dict",
        "empty-bytes",
        "bad-der",
        "cn",
        "cn-after-o",
        "no-cn",
        "two-cns",
        "empty-cn",
    ],
)
def test_client_cert_common_name_shapes(peercert: object, expected: str | None) -> None:
    assert client_cert_common_name(peercert) == expected  # type: ignore[arg-type]


def _write_pair(directory: Path, stem: str, issued: IssuedCert) -> tuple[str, str]:
    cert, key = directory / f"{stem}.crt", directory / f"{stem}.key"
    write_pem(cert, issued.cert_pem)
    write_pem(key, issued.key_pem, private=True)
    return str(cert), str(key)


async def test_common_name_from_a_real_mtls_handshake(tmp_path: Path, ca: IssuedCert) -> None:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=ca.cert_pem.decode())
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_cert_chain(*_write_pair(tmp_path, "server", issue_server_cert(ca)))
    client_ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
    client_ctx.load_cert_chain(
        *_write_pair(tmp_path, "client", issue_client_cert(ca, "gpu.example.com"))
    )
    seen: list[tuple[str | None, str | None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        seen.append(
            (
                client_cert_common_name(writer.get_extra_info("peercert")),
                client_cert_common_name(ssl_object.getpeercert(binary_form=True)),
            )
        )
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with server:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1"
        )
        assert await reader.read() == b"ok"
        writer.close()
    assert seen == [("gpu.example.com", "gpu.example.com")]


# --- command line ----------------------------------------------------------------------------


def test_cli_writes_ca_client_and_server(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ca_dir, out = tmp_path / "ca", tmp_path / "out"
    assert run_certs_command(["ca", "--out", str(ca_dir)]) == 0
    assert (
        run_certs_command(
            ["client", "--ca-dir", str(ca_dir), "--driver", "gpu.example.com", "--out", str(out)]
        )
        == 0
    )
    assert (
        run_certs_command(
            [
                "server",
                "--ca-dir",
                str(ca_dir),
                "--host",
                "127.0.0.1",
                "--host",
                "gk.local",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr()
    assert printed.err == ""
    for path in (
        ca_dir / "ca.crt",
        ca_dir / "ca.key",
        out / "gpu.example.com.crt",
        out / "gpu.example.com.key",
        out / "server.crt",
        out / "server.key",
    ):
        assert f"wrote {path}" in printed.out
        assert _mode(path) == (0o600 if path.suffix == ".key" else 0o644)
    assert "PRIVATE" not in printed.out
    ca = load_ca(ca_dir / "ca.crt", ca_dir / "ca.key")
    client = x509.load_pem_x509_certificate((out / "gpu.example.com.crt").read_bytes())
    client.verify_directly_issued_by(ca.certificate)
    assert client_cert_common_name(client.public_bytes(Encoding.DER)) == "gpu.example.com"
    server = x509.load_pem_x509_certificate((out / "server.crt").read_bytes())
    PolicyBuilder().store(Store([ca.certificate])).build_server_verifier(
        DNSName("gk.local")
    ).verify(server, [])


def test_cli_server_default_hosts(tmp_path: Path) -> None:
    assert run_certs_command(["ca", "--out", str(tmp_path)]) == 0
    assert run_certs_command(["server", "--ca-dir", str(tmp_path), "--out", str(tmp_path)]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    san = _ext(cert, x509.SubjectAlternativeName)
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert len(san.get_values_for_type(x509.IPAddress)) == 2


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "required"),
        (["bogus"], "invalid choice"),
        (["ca"], "--out"),
        (["ca", "--out", "{out}", "--days", "0"], "--days must be at least 1"),
        (["ca", "--out", "{out}", "--days", "x"], "invalid int value"),
        (["ca", "--out", "{ca}"], "refusing to overwrite"),
        (["client", "--ca-dir", "{ca}", "--out", "{out}"], "--driver"),
        (
            ["client", "--ca-dir", "{ca}", "--driver", "../x", "--out", "{out}"],
            "not a valid driver",
        ),
        (["client", "--ca-dir", "{ca}", "--driver", "A_B", "--out", "{out}"], "not a valid driver"),
        (["client", "--ca-dir", "{out}", "--driver", "d", "--out", "{out}"], "ca.crt: cannot read"),
        (["server", "--ca-dir", "{ca}", "--host", "a b", "--out", "{out}"], "--host"),
    ],
    ids=[
        "nothing",
        "unknown",
        "no-out",
        "days-0",
        "days-nan",
        "overwrite",
        "no-driver",
        "driver-traversal",
        "driver-invalid",
        "no-ca",
        "bad-host",
    ],
)
def test_cli_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str], fragment: str
) -> None:
    ca_dir, out = tmp_path / "ca", tmp_path / "out"
    assert run_certs_command(["ca", "--out", str(ca_dir)]) == 0
    capsys.readouterr()
    argv = [a.format(ca=ca_dir, out=out) for a in argv]
    assert run_certs_command(argv) == 2
    printed = capsys.readouterr()
    assert printed.out == ""
    assert printed.err.count("\n") == 1
    assert fragment in printed.err
    assert not out.exists() or not any(out.iterdir())


def test_cli_force_overwrites(tmp_path: Path) -> None:
    assert run_certs_command(["ca", "--out", str(tmp_path)]) == 0
    first = (tmp_path / "ca.crt").read_bytes()
    assert run_certs_command(["ca", "--out", str(tmp_path), "--force"]) == 0
    assert (tmp_path / "ca.crt").read_bytes() != first


def test_cli_help_exits_zero(capsys: pytest.CaptureFixture) -> None:
    assert run_certs_command(["--help"]) == 0
    assert "usage: dra-gatekeeper certs" in capsys.readouterr().out


def test_cli_show_names_the_driver_and_expiry(
    tmp_path: Path, ca: IssuedCert, capsys: pytest.CaptureFixture[str]
) -> None:
    client = issue_client_cert(ca, "gpu.example.com", days=10)
    write_pem(tmp_path / "gpu.crt", client.cert_pem)
    write_pem(tmp_path / "ca.crt", ca.cert_pem)
    assert run_certs_command(["show", str(tmp_path / "gpu.crt")]) == 0
    out = capsys.readouterr().out
    assert "subject CN: gpu.example.com  (driver gpu.example.com)" in out
    assert "role:       client (driver)" in out
    expiry = client.certificate.not_valid_after_utc.isoformat()
    assert f"not after:  {expiry}  (expires in 10 days)" in out
    assert certificate_expiry(tmp_path / "gpu.crt") == client.certificate.not_valid_after_utc
    assert run_certs_command(["show", str(tmp_path / "ca.crt")]) == 0
    assert "role:       CA" in capsys.readouterr().out
    (tmp_path / "junk.crt").write_text("junk")
    assert run_certs_command(["show", str(tmp_path / "junk.crt")]) == 2
    assert (
        capsys.readouterr().err
        == f"dra-gatekeeper certs: {tmp_path / 'junk.crt'}: not a PEM certificate\n"
    )


def test_cli_show_lists_a_server_certificates_names(
    tmp_path: Path, ca: IssuedCert, capsys: pytest.CaptureFixture[str]
) -> None:
    server = issue_server_cert(ca, ["gatekeeper.local", "127.0.0.1", "::1"])
    write_pem(tmp_path / "server.crt", server.cert_pem)
    assert run_certs_command(["show", str(tmp_path / "server.crt")]) == 0
    out = capsys.readouterr().out
    assert "role:       server" in out
    assert "SANs:       DNS:gatekeeper.local, IP:127.0.0.1, IP:::1\n" in out


def test_cli_show_reads_every_certificate_certs_writes_and_one_without_usages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CA carries no extended key usage, so `show` must not need one (cryptography 51 refuses
    an empty ExtendedKeyUsage; .ci/newest --lowest runs this on the floor, cryptography 42)."""
    assert run_certs_command(["ca", "--out", str(tmp_path)]) == 0
    for action in (["client", "--driver", "gpu.example.com"], ["server"]):
        assert run_certs_command([*action, "--ca-dir", str(tmp_path), "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    roles = {"ca.crt": "CA", "gpu.example.com.crt": "client (driver)", "server.crt": "server"}
    for name, role in roles.items():
        assert run_certs_command(["show", str(tmp_path / name)]) == 0, name
        assert f"role:       {role}\n" in capsys.readouterr().out
    # A leaf with neither CA basic constraints nor extended key usage: some other tool's.
    ca = load_ca(tmp_path / "ca.crt", tmp_path / "ca.key")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "plain")])
    plain = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(ca.certificate.not_valid_before_utc)
        .not_valid_after(ca.certificate.not_valid_after_utc)
        .sign(load_pem_private_key(ca.key_pem, None), hashes.SHA256())
    )
    write_pem(tmp_path / "plain.crt", plain.public_bytes(Encoding.PEM))
    assert run_certs_command(["show", str(tmp_path / "plain.crt")]) == 0
    out = capsys.readouterr().out
    assert "role:       other\n" in out and "subject CN: plain\n" in out
