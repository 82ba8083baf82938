"""X.509 made and read with ``cryptography``: CAs, leaf certificates, certificate requests.

EC P-256 keys throughout. Shared by ``dra-gatekeeper certs`` (throwaway PKI), the token
listener's certificate request (:mod:`gatekeeper.listen.servingcert`) and the signer that
answers it (:mod:`gatekeeper.signer`). Imported only by them: ``serve`` without a requested
certificate never loads ``cryptography`` (8 MB).
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CLOCK_SKEW",
    "BadCA",
    "IssuedCert",
    "certificate_request",
    "create_ca",
    "general_name",
    "is_ca",
    "issue_client_cert",
    "issue_server_cert",
    "load_ca_pair",
    "new_key",
    "private_pem",
    "sign_server_cert",
    "subject_alt_names",
]

CLOCK_SKEW = datetime.timedelta(minutes=5)
"""How far before "now" a certificate's validity starts: clocks of the cluster differ."""
_DNS_RE = re.compile(
    r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$", re.IGNORECASE
)


@dataclass(frozen=True, slots=True)
class IssuedCert:
    """A PEM certificate and its unencrypted PKCS#8 PEM private key."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    @property
    def certificate(self) -> x509.Certificate:
        """The parsed certificate."""
        return x509.load_pem_x509_certificate(self.cert_pem)


def new_key() -> ec.EllipticCurvePrivateKey:
    """A new EC P-256 private key."""
    return ec.generate_private_key(ec.SECP256R1())


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """``key`` as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def create_ca(common_name: str = "dra-gatekeeper-ca", *, days: int = 365) -> IssuedCert:
    """A self-signed CA (CA:TRUE, pathlen 0, keyCertSign) valid for ``days``."""
    key = new_key()
    name = _name(common_name)
    builder = (
        _base_builder(name, name, key.public_key(), _until(days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return IssuedCert(_signed(builder, key), private_pem(key))


def issue_client_cert(ca: IssuedCert, common_name: str, *, days: int = 365) -> IssuedCert:
    """A clientAuth certificate with subject CN ``common_name`` (the driver name)."""
    if not common_name:
        raise ValueError("client certificate needs a common name")
    key = new_key()
    cert = _leaf(ca, key.public_key(), common_name, ExtendedKeyUsageOID.CLIENT_AUTH, None, days)
    return IssuedCert(cert, private_pem(key))


def issue_server_cert(
    ca: IssuedCert, hosts: Sequence[str] = ("127.0.0.1", "::1", "localhost"), *, days: int = 365
) -> IssuedCert:
    """A serverAuth certificate with one SAN per host (IP address or DNS name); CN = hosts[0]."""
    key = new_key()
    return IssuedCert(sign_server_cert(ca, key.public_key(), hosts, days=days), private_pem(key))


def sign_server_cert(
    ca: IssuedCert,
    public_key: ec.EllipticCurvePublicKey,
    hosts: Sequence[str],
    *,
    days: int = 365,
    not_after: datetime.datetime | None = None,
    common_name: str | None = None,
) -> bytes:
    """A serverAuth certificate (PEM) for ``public_key`` with one SAN per host, valid for
    ``days`` or until ``not_after``; CN = ``common_name`` or hosts[0]."""
    if isinstance(hosts, str) or not hosts:
        raise ValueError("server certificate needs a sequence of at least one host")
    sans = x509.SubjectAlternativeName([general_name(h) for h in hosts])
    until = not_after if not_after is not None else _until(days)
    usage = ExtendedKeyUsageOID.SERVER_AUTH
    return _leaf(ca, public_key, common_name or hosts[0], usage, sans, until)


def certificate_request(
    key: ec.EllipticCurvePrivateKey, hosts: Sequence[str], common_name: str
) -> bytes:
    """A PKCS#10 request (PEM) for ``key`` naming ``hosts`` as SANs, signed by ``key``."""
    sans = x509.SubjectAlternativeName([general_name(h) for h in hosts])
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_name(common_name))
        .add_extension(sans, critical=False)
    )
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


class BadCA(ValueError):
    """What is wrong with a CA pair: ``part`` is ``cert``, ``key``, or ``pair`` (they do not
    match)."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(message)
        self.part = part


def load_ca_pair(cert_pem: bytes, key_pem: bytes) -> IssuedCert:
    """A CA as :func:`create_ca` makes one; :class:`BadCA` saying what is wrong with it."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise BadCA("cert", "not a PEM certificate") from None
    try:
        key = _private_key(key_pem)
    except (ValueError, TypeError):
        raise BadCA("key", "not an unencrypted PEM EC private key") from None
    if not is_ca(cert):
        raise BadCA("cert", "not a CA certificate (basicConstraints CA:TRUE missing)")
    if key.public_key() != cert.public_key():
        raise BadCA("pair", "key does not match the certificate")
    return IssuedCert(cert_pem, key_pem)


def is_ca(cert: x509.Certificate) -> bool:
    """Whether ``cert`` says CA:TRUE."""
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def subject_alt_names(cert: x509.Certificate) -> list[str]:
    """``DNS:name`` and ``IP:address`` of every SAN, DNS names first."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    dns = [f"DNS:{name}" for name in sans.get_values_for_type(x509.DNSName)]
    ips = [f"IP:{address}" for address in sans.get_values_for_type(x509.IPAddress)]
    return dns + ips


def general_name(host: str) -> x509.GeneralName:
    """``host`` as a SAN: an IP address, else a DNS name; ValueError for anything else."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if len(host) > 253 or not _DNS_RE.match(host):
        raise ValueError(f"host {host!r} is neither an IP address nor a DNS name")
    return x509.DNSName(host.lower())


def _leaf(
    ca: IssuedCert,
    public_key: ec.EllipticCurvePublicKey,
    common_name: str,
    usage: x509.ObjectIdentifier,
    sans: x509.SubjectAlternativeName | None,
    until: datetime.datetime | int,
) -> bytes:
    ca_cert = ca.certificate
    ca_key = _private_key(ca.key_pem)
    not_after = _until(until) if isinstance(until, int) else until
    builder = (
        _base_builder(_name(common_name), ca_cert.subject, public_key, not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans is not None:
        builder = builder.add_extension(sans, critical=False)
    return _signed(builder, ca_key)


def _until(days: int) -> datetime.datetime:
    if days < 1:
        raise ValueError("days must be at least 1")
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days)


def _base_builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    not_after: datetime.datetime,
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
    )


def _signed(builder: x509.CertificateBuilder, signer: ec.EllipticCurvePrivateKey) -> bytes:
    return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _private_key(key_pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("CA key is not an EC key")
    return key
