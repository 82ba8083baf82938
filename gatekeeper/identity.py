"""Who is calling: the driver behind a Unix socket directory or an mTLS client certificate."""

from __future__ import annotations

import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.certs import client_cert_common_name
from gatekeeper.errors import Refusal

__all__ = ["DRIVERS_GROUP", "Identity", "identify"]

DRIVERS_GROUP = "dra-gatekeeper:drivers"


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller. ``driver`` is the DRA driver name (audit ``user.username``)."""

    driver: str
    transport: str
    """``unix`` or ``mtls``."""
    peer: Mapping[str, str] = field(default_factory=dict)
    """Peer facts for the audit event: uid/gid/pid (Unix) or certificate serial (mTLS)."""


def identify(transport: Any, socket_drivers: Mapping[str, str]) -> Identity:
    """Identify the peer of an accepted connection, or raise a 401 Refusal.

    ``socket_drivers`` maps each listening Unix socket path to the driver whose directory it
    is in (DESIGN §4.2): a driver pod mounts only its own directory.
    """
    if transport is None:
        raise Refusal(401, "connection closed before identification", "Unauthorized")
    sockname = transport.get_extra_info("sockname")
    if isinstance(sockname, str) and sockname:
        driver = socket_drivers.get(sockname)
        if driver is None:
            raise Refusal(401, f"no driver is bound to socket {sockname}", "Unauthorized")
        return Identity(driver=driver, transport="unix", peer=_peer_credentials(transport))
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is not None:
        cert = ssl_object.getpeercert()
        common_name = client_cert_common_name(cert) if cert else None
        if not common_name:
            raise Refusal(401, "no verified client certificate with a subject CN", "Unauthorized")
        return Identity(driver=common_name, transport="mtls", peer=_cert_facts(cert))
    raise Refusal(401, "no identity: use the driver's Unix socket or mTLS", "Unauthorized")


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
