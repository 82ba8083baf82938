"""The certificate expiry reader agrees with a full X.509 library (cryptography) on real
certificates, both time encodings included, and refuses what it does not understand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gatekeeper.cli.certs import create_ca, issue_client_cert, issue_server_cert
from gatekeeper.codec.certdates import first_pem_certificate, not_after


def _certificate(until: datetime, *, serial: int = 1, cn: str = "x") -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(datetime(1990, 1, 1, tzinfo=UTC))
        .not_valid_after(until)
        .sign(key, hashes.SHA256())
    )


@pytest.mark.parametrize(
    "until",
    [
        datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC),  # UTCTime, 20YY
        datetime(2050, 1, 1, tzinfo=UTC),  # GeneralizedTime from 2050 on
        datetime(2126, 6, 30, 12, 0, 1, tzinfo=UTC),
        datetime(1999, 1, 1, tzinfo=UTC),  # UTCTime, 19YY (long expired)
    ],
    ids=["utctime-2049", "generalized-2050", "generalized-2126", "utctime-1999"],
)
def test_both_time_encodings(until: datetime) -> None:
    cert = _certificate(until, serial=2**159 - 1, cn="a" * 64)  # long serial and issuer
    der = cert.public_bytes(serialization.Encoding.DER)
    assert not_after(der) == cert.not_valid_after_utc == until


def test_the_certificates_the_gatekeeper_issues() -> None:
    ca = create_ca()
    for issued in (ca, issue_server_cert(ca), issue_client_cert(ca, "gpu.example.com")):
        der = first_pem_certificate(issued.cert_pem)
        assert not_after(der) == issued.certificate.not_valid_after_utc
        assert abs(not_after(der) - datetime.now(UTC)) > timedelta(days=1)


def test_the_first_certificate_of_a_chain() -> None:
    first, second = (_certificate(datetime(y, 1, 1, tzinfo=UTC)) for y in (2030, 2040))
    pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (first, second))
    assert not_after(first_pem_certificate(b"junk before\n" + pem)).year == 2030


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"junk",
        b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        b"-----BEGIN CERTIFICATE-----\nMAM=\n-----END CERTIFICATE-----\n",  # 30 03: truncated
        b"-----BEGIN CERTIFICATE-----\nAgEB\n-----END CERTIFICATE-----\n",  # an INTEGER
    ],
    ids=["empty", "junk", "bad-base64", "truncated", "not-a-sequence"],
)
def test_what_it_does_not_understand_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        not_after(first_pem_certificate(data))


def test_every_truncation_of_a_certificate_is_refused() -> None:
    der = _certificate(datetime(2030, 1, 1, tzinfo=UTC)).public_bytes(serialization.Encoding.DER)
    for cut in range(len(der)):
        try:
            found = not_after(der[:cut])
        except ValueError:
            continue
        raise AssertionError(f"a certificate cut at {cut} bytes read as expiring {found}")
