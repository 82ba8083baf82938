"""Throwaway PKI for the demo, the tests and `dra-gatekeeper certs`.

A CA, driver client certificates (CN = driver name) and server certificates for the mTLS
listener; EC P-256 keys. Not a production CA: no revocation, no key protection beyond 0600.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from gatekeeper.codec.pki import (
    BadCA,
    IssuedCert,
    create_ca,
    general_name,
    is_ca,
    issue_client_cert,
    issue_server_cert,
    load_ca_pair,
    subject_alt_names,
)
from gatekeeper.errors import ConfigError
from gatekeeper.listen.identity import client_cert_common_name
from gatekeeper.listen.tls import certificate_expiry
from gatekeeper.names import is_driver_name

__all__ = [
    "IssuedCert",
    "certificate_expiry",
    "create_ca",
    "describe_certificate",
    "issue_client_cert",
    "issue_server_cert",
    "load_ca",
    "run_certs_command",
    "write_pem",
]

_CA_CERT = "ca.crt"
_CA_KEY = "ca.key"
_SERVER_STEM = "server"
_DEFAULT_HOSTS = ("127.0.0.1", "::1", "localhost")


# --- files -----------------------------------------------------------------------------------


def write_pem(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write ``data`` to ``path`` atomically; ``private`` files are 0600 from creation on.

    The content goes to a temporary file in the same directory (mkstemp creates it 0600)
    that then replaces ``path``, so a symlink at ``path`` is replaced, never followed, and
    no reader ever sees a partial or world-readable key.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if not private:
                os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_ca(cert_path: Path, key_path: Path) -> IssuedCert:
    """Read a CA written by :func:`create_ca`; ConfigError if unreadable, invalid or mismatched."""
    cert_pem = _read(cert_path)
    key_pem = _read(key_path)
    try:
        return load_ca_pair(cert_pem, key_pem)
    except BadCA as exc:
        if exc.part == "cert":
            raise ConfigError(f"{cert_path}: {exc}") from None
        mismatch = f" {cert_path}" if exc.part == "pair" else ""
        raise ConfigError(f"{key_path}: {exc}{mismatch}") from None


def _read(path: Path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _load_pem_file(path: str | Path) -> x509.Certificate:
    data = _read(Path(path))
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError:
        raise ConfigError(f"{path}: not a PEM certificate") from None


def describe_certificate(path: str | Path, *, now: datetime.datetime | None = None) -> str:
    """``certs show``: the subject CN (the driver, for a client cert), role, issuer, validity."""
    cert = _load_pem_file(path)
    now = now or datetime.datetime.now(datetime.UTC)
    cn = client_cert_common_name(cert.public_bytes(serialization.Encoding.DER)) or "-"
    # A list of OIDs, not an ExtendedKeyUsage: cryptography 51 refuses an empty one, and a CA
    # (the one `certs ca` writes among them) has no such extension.
    usages: list[x509.ObjectIdentifier]
    try:
        usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        usages = []
    if is_ca(cert):
        role = "CA"
    elif ExtendedKeyUsageOID.CLIENT_AUTH in usages:
        role = "client (driver)"
    elif ExtendedKeyUsageOID.SERVER_AUTH in usages:
        role = "server"
    else:
        role = "other"
    expiry = cert.not_valid_after_utc
    days = (expiry - now).total_seconds() / 86400
    left = f"expires in {days:.0f} days" if days >= 0 else f"EXPIRED {-days:.0f} days ago"
    lines = [
        f"file:       {path}",
        f"subject CN: {cn}" + (f"  (driver {cn})" if role == "client (driver)" else ""),
        f"role:       {role}",
        f"issuer:     {cert.issuer.rfc4514_string()}",
        f"not before: {cert.not_valid_before_utc.isoformat()}",
        f"not after:  {expiry.isoformat()}  ({left})",
        f"serial:     {cert.serial_number:x}",
    ]
    names = subject_alt_names(cert)
    if names or role == "server":
        # A client connects only to a name or address listed here: the first thing to check
        # when a driver's TLS handshake fails with a hostname mismatch.
        lines.insert(4, f"SANs:       {', '.join(names) or '(none)'}")
    return "\n".join(lines) + "\n"


# --- peer identity ---------------------------------------------------------------------------


# --- command line ----------------------------------------------------------------------------


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dra-gatekeeper certs", description="Throwaway PKI for mTLS drivers.")
    sub = parser.add_subparsers(dest="action", required=True, parser_class=_Parser)
    ca = sub.add_parser("ca", help="create a CA (ca.crt, ca.key)")
    ca.add_argument("--cn", default="dra-gatekeeper-ca", help="CA common name")
    client = sub.add_parser("client", help="issue a driver client cert (<driver>.crt/.key)")
    client.add_argument("--driver", required=True, help="driver name, becomes the subject CN")
    server = sub.add_parser("server", help="issue a listener server cert (server.crt/.key)")
    server.add_argument(
        "--host",
        action="append",
        help="IP or DNS SAN, repeatable (default: 127.0.0.1 ::1 localhost)",
    )
    show = sub.add_parser("show", help="print a certificate's driver (CN), role and expiry")
    show.add_argument("file", type=Path, help="a PEM certificate")
    for p in (client, server):
        p.add_argument("--ca-dir", required=True, type=Path, help="directory with ca.crt, ca.key")
    for p in (ca, client, server):
        p.add_argument("--out", required=True, type=Path, help="output directory")
        p.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
        p.add_argument("--force", action="store_true", help="overwrite existing files")
    return parser


def run_certs_command(args: Sequence[str]) -> int:
    """Run ``dra-gatekeeper certs ARGS``; 0 on success, 2 with one stderr line on bad input."""
    try:
        ns = _parser().parse_args(list(args))
        if ns.action == "show":
            sys.stdout.write(describe_certificate(ns.file))
            return 0
        for path in _issue_from_args(ns):
            print(f"wrote {path}")
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except (_UsageError, ConfigError, ValueError) as exc:
        print(f"dra-gatekeeper certs: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"dra-gatekeeper certs: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


def _issue_from_args(ns: argparse.Namespace) -> list[Path]:
    if ns.days < 1:
        raise _UsageError("--days must be at least 1")
    if ns.action == "ca":
        return _write_pair(ns.out, "ca", create_ca(ns.cn, days=ns.days), ns.force)
    ca = load_ca(ns.ca_dir / _CA_CERT, ns.ca_dir / _CA_KEY)
    if ns.action == "client":
        if not is_driver_name(ns.driver):
            raise _UsageError(f"--driver {ns.driver!r} is not a valid driver name (DNS subdomain)")
        issued = issue_client_cert(ca, ns.driver, days=ns.days)
        return _write_pair(ns.out, ns.driver, issued, ns.force)
    hosts = ns.host or list(_DEFAULT_HOSTS)
    for host in hosts:
        try:
            general_name(host)
        except ValueError as exc:
            raise _UsageError(f"--host: {exc}") from None
    issued = issue_server_cert(ca, hosts, days=ns.days)
    return _write_pair(ns.out, _SERVER_STEM, issued, ns.force)


def _write_pair(out: Path, stem: str, issued: IssuedCert, force: bool) -> list[Path]:
    cert_path, key_path = out / f"{stem}.crt", out / f"{stem}.key"
    if not force:
        for path in (cert_path, key_path):
            if path.exists() or path.is_symlink():
                raise _UsageError(f"refusing to overwrite {path} (use --force)")
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_pem(key_path, issued.key_pem, private=True)
    write_pem(cert_path, issued.cert_pem)
    return [cert_path, key_path]
