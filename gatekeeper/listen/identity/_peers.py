"""The driver behind a Unix socket directory or an mTLS client certificate, known once per
connection, when it is made (the token listener's callers show themselves per request).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping
from typing import Any

from gatekeeper.errors import Refusal
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.types import Identity

__all__ = ["client_cert_common_name", "identify"]


def identify(transport: Any, socket_drivers: Mapping[str, str]) -> Identity:
    """Identify the peer of an accepted connection, or raise a 401 Refusal.

    ``socket_drivers`` maps each listening Unix socket path to the driver whose directory it
    is in (DESIGN §4.2): a driver pod mounts only its own directory.
    """
    if transport is None:
        raise _unauthorized("connection closed before identification")
    sockname = transport.get_extra_info("sockname")
    if isinstance(sockname, str) and sockname:
        driver = socket_drivers.get(sockname)
        if driver is None:
            raise _unauthorized(f"no driver is bound to socket {sockname}")
        peer = _peer_credentials(transport)
        return Identity(driver=driver, transport=ListenerKind.UNIX, peer=peer)
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is not None:
        cert = ssl_object.getpeercert()
        common_name = client_cert_common_name(cert) if cert else None
        if not common_name:
            raise _unauthorized(
                "no verified client certificate with a subject CN",
                "present the driver's client certificate (CN = the driver name), signed by the "
                "gatekeeper's client CA",
            )
        return Identity(driver=common_name, transport=ListenerKind.MTLS, peer=_cert_facts(cert))
    raise _unauthorized("no identity: use the driver's Unix socket or mTLS")


def _unauthorized(reason: str, hint: str = "") -> Refusal:
    # The Status says why, as the audit event does: "Unauthorized" alone leaves a driver author
    # guessing which of the identity rules failed (DESIGN §4.2).
    return Refusal(401, reason, f"Unauthorized: {reason}" + (f"; {hint}" if hint else ""))


def _peer_credentials(transport: Any) -> dict[str, str]:
    sock = transport.get_extra_info("socket")
    if sock is None or not hasattr(socket, "SO_PEERCRED"):
        return {}
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return {}
    pid, uid, gid = struct.unpack("3i", raw)
    return {"pid": str(pid), "uid": str(uid), "gid": str(gid)}


def _cert_facts(cert: Mapping[str, Any]) -> dict[str, str]:
    facts = {"certSerial": str(cert.get("serialNumber", ""))}
    if "notAfter" in cert:
        facts["certNotAfter"] = str(cert["notAfter"])
    return facts


def client_cert_common_name(der_or_peercert: bytes | Mapping[str, Any] | None) -> str | None:
    """The subject CN of a peer certificate, or None if there is not exactly one.

    Accepts ``SSLObject.getpeercert()``'s dict, or DER bytes (``getpeercert(binary_form=True)``).
    Several CNs are ambiguous (Go takes the last, others the first), so they yield None.
    """
    if not der_or_peercert:
        return None
    if isinstance(der_or_peercert, bytes | bytearray | memoryview):
        return _cn_from_der(bytes(der_or_peercert))
    subject = der_or_peercert.get("subject") or ()
    names = [
        value
        for rdn in subject
        for attr, value in rdn
        if attr == "commonName" and isinstance(value, str)
    ]
    return names[0] if len(names) == 1 and names[0] else None


def _cn_from_der(der: bytes) -> str | None:
    # Imported here: only the certs command reads a DER certificate; serve reads the verified
    # peer's decoded certificate, and a full X.509 library costs it 8 MB of memory.
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError:
        return None
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(attrs) != 1 or not isinstance(attrs[0].value, str) or not attrs[0].value:
        return None
    return attrs[0].value
