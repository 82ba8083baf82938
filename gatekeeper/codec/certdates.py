"""When an X.509 certificate expires, read from its DER bytes by the standard library alone.

``serve`` needs one fact of its serving certificate that ``ssl`` does not give for a file:
its ``notAfter`` (the expiry metric). Reading it takes a walk of four DER headers; importing
a full X.509 library for it cost the process 8 MB of resident memory (bench/README.md,
"Memory"). Anything this reader does not understand is a ValueError, never a guess.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime

__all__ = ["first_pem_certificate", "not_after"]

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----([A-Za-z0-9+/=\s]+?)-----END CERTIFICATE-----")
_SEQUENCE, _INTEGER, _VERSION = 0x30, 0x02, 0xA0
_UTC_TIME, _GENERALIZED_TIME = 0x17, 0x18


def first_pem_certificate(data: bytes) -> bytes:
    """The DER bytes of the first ``CERTIFICATE`` block of PEM ``data``; ValueError if none."""
    match = _PEM.search(data)
    if match is None:
        raise ValueError("no PEM certificate")
    try:
        return base64.b64decode(b"".join(match.group(1).split()), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"bad base64 in the PEM certificate: {exc}") from None


def not_after(der: bytes) -> datetime:
    """The ``notAfter`` of the certificate ``der`` (RFC 5280 §4.1.2.5), in UTC."""
    certificate = _element(der, 0, _SEQUENCE)
    tbs = _element(der, certificate[1], _SEQUENCE)
    at = tbs[1]
    if der[at : at + 1] == bytes([_VERSION]):
        at = _element(der, at, _VERSION)[2]
    for tag in (_INTEGER, _SEQUENCE, _SEQUENCE):  # serialNumber, signature, issuer
        at = _element(der, at, tag)[2]
    validity = _element(der, at, _SEQUENCE)
    not_before = _element(der, validity[1])
    tag, start, end = _element(der, not_before[2])
    if end > validity[2]:
        raise ValueError("validity overruns its sequence")
    return _time(tag, der[start:end])


def _element(der: bytes, at: int, tag: int | None = None) -> tuple[int, int, int]:
    """(tag, content start, content end) of the DER element at ``at``; ``tag`` if required."""
    if at + 2 > len(der):
        raise ValueError("truncated DER")
    found, length = der[at], der[at + 1]
    if tag is not None and found != tag:
        raise ValueError(f"DER tag 0x{found:02x} where 0x{tag:02x} was expected")
    start = at + 2
    if length & 0x80:
        octets = length & 0x7F
        if not 1 <= octets <= 4 or start + octets > len(der):
            raise ValueError("bad DER length")
        length = int.from_bytes(der[start : start + octets], "big")
        start += octets
    end = start + length
    if end > len(der):
        raise ValueError("truncated DER")
    return found, start, end


def _time(tag: int, raw: bytes) -> datetime:
    text = raw.decode("ascii", errors="replace")
    if tag == _UTC_TIME and len(text) == 13 and text.endswith("Z"):
        # RFC 5280 §4.1.2.5.1: YY of 50 or more is 19YY, below 50 is 20YY.
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif not (tag == _GENERALIZED_TIME and len(text) == 15 and text.endswith("Z")):
        raise ValueError(f"not an RFC 5280 time: tag 0x{tag:02x} {text!r}")
    return datetime.strptime(text, "%Y%m%d%H%M%SZ").replace(tzinfo=UTC)
