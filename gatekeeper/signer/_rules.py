"""When the signer signs (docs/security.md, "Key custody"): a request of its ``signerName`` is
approved only when

- its requester (``spec.username``, filled in by the apiserver) is the gatekeeper's
  ServiceAccount,
- that requester's token was bound to a pod on node N (``spec.extra``: the apiserver's
  ``authentication.kubernetes.io/pod-name`` and ``node-name``),
- it asks for a server certificate (usages) of an EC key it holds (the request's signature),
  naming only IP addresses and DNS names,
- and every one of them is one of Node N's ``status.addresses``, or loopback, and none is
  another node's too (a node writes its own status: one that claims another's address gets
  nothing for it while the other claims it as well).

Anything else is denied, and the condition says which rule and field. Pure: the request is
read by :func:`read_request`, the Nodes fetched by the caller.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID

from gatekeeper.types import KubeObject

__all__ = [
    "ALLOWED_USAGES",
    "LOOPBACK",
    "NODE_NAME_EXTRA",
    "POD_NAME_EXTRA",
    "Approval",
    "Denial",
    "Requested",
    "SignerRules",
    "addresses_of",
    "decide",
    "node_of",
    "read_request",
]

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
ALLOWED_USAGES = frozenset({"digital signature", "server auth"})
LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
"""Every node's own: a certificate for them lets nobody pose as another node."""
_CURVES = (ec.SECP256R1, ec.SECP384R1)


@dataclass(frozen=True, slots=True)
class SignerRules:
    """What this signer signs: its name, the one requester it serves, and for how long."""

    signer_name: str
    gatekeeper: str
    """The gatekeeper's ServiceAccount as a username: ``system:serviceaccount:NS:NAME``."""
    lifetime: int = 7 * 86400
    """Seconds a certificate is valid at most (a shorter ``spec.expirationSeconds`` wins)."""


@dataclass(frozen=True, slots=True)
class Requested:
    """What a PKCS#10 request asks for: its key, and the names (IPs, DNS names) in order."""

    public_key: ec.EllipticCurvePublicKey
    addresses: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Approval:
    """Sign a certificate for ``addresses`` of ``node``, valid ``lifetime`` seconds."""

    node: str
    requested: Requested
    lifetime: int

    @property
    def message(self) -> str:
        return (
            f"the gatekeeper's pod on node {self.node} asked for its own addresses "
            f"({', '.join(self.requested.addresses)})"
        )


@dataclass(frozen=True, slots=True)
class Denial:
    """Deny: ``reason`` (a condition reason, CamelCase) and a message naming field and rule."""

    reason: str
    message: str


def node_of(csr: KubeObject) -> str | None:
    """The node the requester's token was bound to, if it says exactly one."""
    values = _extra(csr).get(NODE_NAME_EXTRA, ())
    return values[0] if len(values) == 1 and values[0] else None


def decide(
    csr: KubeObject,
    node: KubeObject | None,
    rules: SignerRules,
    others: Iterable[KubeObject] = (),
) -> Approval | Denial:
    """Approve ``csr`` or deny it, with ``node`` the Node :func:`node_of` names (None when it
    names none, or none exists) and ``others`` every other Node."""
    spec = csr.get("spec") if isinstance(csr.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    username = str(spec.get("username", ""))
    if username != rules.gatekeeper:
        return Denial(
            "RequesterNotGatekeeper",
            f"spec.username {username!r} is not the gatekeeper's ServiceAccount "
            f"({rules.gatekeeper}): signer {rules.signer_name} signs only for its pods",
        )
    extra = _extra(csr)
    pods, nodes = extra.get(POD_NAME_EXTRA, ()), extra.get(NODE_NAME_EXTRA, ())
    if len(pods) != 1 or len(nodes) != 1:
        return Denial(
            "TokenNotPodBound",
            f"spec.extra has no single {POD_NAME_EXTRA} and {NODE_NAME_EXTRA}: the request was "
            "made with a token not bound to a pod (a legacy, unbound or node-bound token), "
            "which shows no node the requester runs on",
        )
    usages = [str(u) for u in spec.get("usages") or ()]
    if "server auth" not in usages or not set(usages) <= ALLOWED_USAGES:
        return Denial(
            "UsagesNotAllowed",
            f"spec.usages {usages} must be server auth (and digital signature) only: "
            f"signer {rules.signer_name} signs serving certificates",
        )
    try:
        requested = read_request(spec.get("request"))
    except ValueError as exc:
        return Denial("InvalidRequest", f"spec.request: {exc}")
    if node is None:
        return Denial(
            "NodeNotFound",
            f"node {nodes[0]!r} ({NODE_NAME_EXTRA} of the requester's token) does not exist",
        )
    if stranger := _foreign(requested.addresses, node):
        known = ", ".join(addresses_of(node)) or "none"
        return Denial(
            "AddressNotOfNode",
            f"spec.request asks for {stranger}, which is not one of node {nodes[0]}'s "
            f"status.addresses ({known}) nor loopback: a gatekeeper may ask only for its own "
            "node's addresses",
        )
    for other in others:
        name = str(other.get("metadata", {}).get("name", ""))
        if name != nodes[0] and (shared := _shared(requested.addresses, other)):
            return Denial(
                "AddressOfAnotherNode",
                f"spec.request asks for {shared}, which node {name}'s status.addresses list "
                f"too: an address two nodes claim is signed for neither",
            )
    lifetime = rules.lifetime
    asked = spec.get("expirationSeconds")
    if isinstance(asked, int) and not isinstance(asked, bool) and 0 < asked < lifetime:
        lifetime = asked
    return Approval(nodes[0], requested, lifetime)


def read_request(value: Any) -> Requested:
    """The PKCS#10 request of ``spec.request`` (base64 of PEM); ValueError saying what is wrong:
    not PEM, a signature that does not verify (the requester does not hold the key), a key
    other than EC P-256/P-384, an extension other than subjectAltName, a name other than an
    IP address or DNS name, or no name at all."""
    try:
        pem = base64.b64decode(str(value or ""), validate=True)
        request = x509.load_pem_x509_csr(pem)
    except (binascii.Error, ValueError):
        raise ValueError("not a PEM certificate request") from None
    if not request.is_signature_valid:
        raise ValueError("its signature does not verify: the requester does not hold the key")
    key = request.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, _CURVES):
        raise ValueError("the key must be EC P-256 or P-384 (what the gatekeeper makes)")
    addresses: list[str] = []
    for extension in request.extensions:
        if extension.oid != ExtensionOID.SUBJECT_ALTERNATIVE_NAME:
            raise ValueError(f"asks for the extension {extension.oid.dotted_string}: only names")
        assert isinstance(extension.value, x509.SubjectAlternativeName)
        for name in extension.value:
            if isinstance(name, x509.IPAddress):
                addresses.append(str(name.value))
            elif isinstance(name, x509.DNSName):
                addresses.append(name.value.lower())
            else:
                raise ValueError(f"asks for the name {name!r}: only IP addresses and DNS names")
    if not addresses:
        raise ValueError("names no address (subjectAltName)")
    return Requested(key, tuple(addresses))


def _extra(csr: KubeObject) -> Mapping[str, Sequence[str]]:
    spec = csr.get("spec") if isinstance(csr.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    extra = spec.get("extra") if isinstance(spec.get("extra"), dict) else {}
    assert isinstance(extra, dict)
    return {
        str(key): tuple(str(v) for v in values)
        for key, values in extra.items()
        if isinstance(values, list)
    }


def addresses_of(node: KubeObject) -> list[str]:
    """A Node's ``status.addresses``, as written."""
    status = node.get("status") if isinstance(node.get("status"), dict) else {}
    assert isinstance(status, dict)
    return [
        str(entry["address"])
        for entry in status.get("addresses") or ()
        if isinstance(entry, dict) and isinstance(entry.get("address"), str)
    ]


_Address = ipaddress.IPv4Address | ipaddress.IPv6Address | str


def _parsed(address: str) -> _Address:
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        return address.lower()


def _foreign(addresses: Sequence[str], node: KubeObject) -> str | None:
    """The first address that is neither the node's nor loopback."""
    known: set[_Address] = {*LOOPBACK, *(_parsed(a) for a in addresses_of(node))}
    return next((a for a in addresses if _parsed(a) not in known), None)


def _shared(addresses: Sequence[str], other: KubeObject) -> str | None:
    """The first address (loopback aside) that ``other`` lists too."""
    theirs = {_parsed(a) for a in addresses_of(other)}
    return next((a for a in addresses if _parsed(a) in theirs and _parsed(a) not in LOOPBACK), None)
