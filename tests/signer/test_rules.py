"""When the signer signs, table-driven on real PKCS#10 requests: only the gatekeeper's
ServiceAccount, with a token bound to a pod on node N, for node N's own addresses (or loopback),
a serving certificate of an EC key it holds; every other request denied naming field and rule."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from gatekeeper.codec import pki
from gatekeeper.signer import Approval, Denial, SignerRules, decide, node_of

GATEKEEPER = "system:serviceaccount:kube-system:dra-gatekeeper"
RULES = SignerRules("dra-gatekeeper.io/token-listener", GATEKEEPER, lifetime=86400)
POD_BOUND = {
    "authentication.kubernetes.io/pod-name": ["dra-gatekeeper-x1"],
    "authentication.kubernetes.io/pod-uid": ["0c6c"],
    "authentication.kubernetes.io/node-name": ["node-a"],
    "authentication.kubernetes.io/node-uid": ["9e1f"],
}
NODE_A = {
    "metadata": {"name": "node-a"},
    "status": {"addresses": [
        {"type": "InternalIP", "address": "10.0.0.7"},
        {"type": "InternalIP", "address": "fd00::7"},
        {"type": "Hostname", "address": "Node-A.example"},
    ]},
}  # fmt: skip


def request_of(hosts: list[str], key: Any = None, extra_ext: x509.ExtensionType | None = None,
               ) -> str:  # fmt: skip
    key = key or pki.new_key()
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dra-gatekeeper:node-a")])
    )
    if hosts:
        names = x509.SubjectAlternativeName([pki.general_name(h) for h in hosts])
        builder = builder.add_extension(names, critical=False)
    if extra_ext is not None:
        builder = builder.add_extension(extra_ext, critical=True)
    pem = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    return base64.b64encode(pem).decode()


def csr(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "signerName": RULES.signer_name,
        "username": GATEKEEPER,
        "groups": ["system:serviceaccounts", "system:authenticated"],
        "extra": POD_BOUND,
        "usages": ["digital signature", "server auth"],
        "request": request_of(["10.0.0.7", "127.0.0.1"]),
    }
    spec.update(changes)
    return {"metadata": {"name": "dra-gatekeeper-node-a-x"}, "spec": spec}


def _tampered() -> str:
    der = base64.b64decode(request_of(["10.0.0.7"]))
    loaded = x509.load_pem_x509_csr(der).public_bytes(serialization.Encoding.DER)
    broken = loaded[:-1] + bytes([loaded[-1] ^ 1])  # the signature's last byte
    pem = b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(broken)
    return base64.b64encode(pem + b"-----END CERTIFICATE REQUEST-----\n").decode()


def _uri_request() -> str:
    key = pki.new_key()
    builder = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://x/y")]),
            critical=False,
        )
    )
    pem = builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    return base64.b64encode(pem).decode()


DENIED: list[tuple[str, Callable[[], dict[str, Any]], str, str]] = [
    ("another-service-account", lambda: csr(username="system:serviceaccount:kube-system:other"),
     "RequesterNotGatekeeper", "spec.username 'system:serviceaccount:kube-system:other' is not "
     "the gatekeeper's ServiceAccount"),
    ("a-user", lambda: csr(username="alice", extra={}), "RequesterNotGatekeeper", "'alice'"),
    ("unbound-token", lambda: csr(extra={}), "TokenNotPodBound", "a token not bound to a pod"),
    ("node-bound-token", lambda: csr(extra={
        "authentication.kubernetes.io/node-name": ["node-a"]}), "TokenNotPodBound", "pod-name"),
    ("two-nodes", lambda: csr(extra={**POD_BOUND,
        "authentication.kubernetes.io/node-name": ["node-a", "node-b"]}), "TokenNotPodBound", ""),
    ("another-nodes-address", lambda: csr(request=request_of(["10.0.0.8"])), "AddressNotOfNode",
     "spec.request asks for 10.0.0.8, which is not one of node node-a's status.addresses "
     "(10.0.0.7, fd00::7, Node-A.example) nor loopback"),
    ("a-dns-name-not-the-nodes", lambda: csr(request=request_of(["node-b.example"])),
     "AddressNotOfNode", "node-b.example"),
    ("client-auth", lambda: csr(usages=["digital signature", "client auth"]),
     "UsagesNotAllowed", "must be server auth"),
    ("no-usage-server-auth", lambda: csr(usages=["digital signature"]), "UsagesNotAllowed", ""),
    ("garbage", lambda: csr(request="bm90IGEgY3Ny"), "InvalidRequest",
     "spec.request: not a PEM certificate request"),
    ("signature", lambda: csr(request=_tampered()), "InvalidRequest", "does not verify"),
    ("rsa-key", lambda: csr(request=request_of(["10.0.0.7"], key=rsa.generate_private_key(
        65537, 2048))), "InvalidRequest", "EC P-256 or P-384"),
    ("asks-to-be-a-ca", lambda: csr(request=request_of(["10.0.0.7"], extra_ext=(
        x509.BasicConstraints(ca=True, path_length=None)))), "InvalidRequest",
     "asks for the extension 2.5.29.19"),
    ("uri-name", lambda: csr(request=_uri_request()), "InvalidRequest", "only IP addresses"),
    ("no-name", lambda: csr(request=request_of([])), "InvalidRequest", "names no address"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "make", "reason", "words"), DENIED, ids=[d[0] for d in DENIED])
def test_denied_naming_the_rule(
    case: str, make: Callable[[], dict[str, Any]], reason: str, words: str
) -> None:
    verdict = decide(make(), NODE_A, RULES)
    assert isinstance(verdict, Denial), verdict
    assert verdict.reason == reason and words in verdict.message


def test_a_node_that_does_not_exist_is_denied() -> None:
    verdict = decide(csr(), None, RULES)
    assert verdict == Denial(
        "NodeNotFound",
        "node 'node-a' (authentication.kubernetes.io/node-name of the requester's token) does "
        "not exist",
    )


@pytest.mark.parametrize(
    "hosts",
    [["10.0.0.7"], ["10.0.0.7", "127.0.0.1", "::1"], ["fd00::7"], ["node-a.example"],
     ["127.0.0.1"]],
    ids=["internal-ip", "with-loopback", "ipv6", "hostname-any-case", "loopback-only"],
)  # fmt: skip
def test_the_nodes_own_addresses_are_signed(hosts: list[str]) -> None:
    key = pki.new_key()
    verdict = decide(csr(request=request_of(hosts, key=key)), NODE_A, RULES)
    assert isinstance(verdict, Approval)
    assert verdict.node == "node-a" and verdict.lifetime == 86400
    assert verdict.requested.addresses == tuple(h.lower() for h in hosts)
    assert verdict.requested.public_key == key.public_key()


def test_a_shorter_expiration_asked_for_is_kept_a_longer_one_is_not() -> None:
    shorter = decide(csr(expirationSeconds=3600), NODE_A, RULES)
    longer = decide(csr(expirationSeconds=10 * 86400), NODE_A, RULES)
    assert isinstance(shorter, Approval) and shorter.lifetime == 3600
    assert isinstance(longer, Approval) and longer.lifetime == 86400


def test_the_node_is_the_tokens_never_the_requests() -> None:
    """A request naming node-b in its subject, from node-a's token, is node-a's."""
    assert node_of(csr()) == "node-a"
    assert node_of(csr(extra={})) is None
    key = ec.generate_private_key(ec.SECP384R1())
    verdict = decide(csr(request=request_of(["10.0.0.7"], key=key)), NODE_A, RULES)
    assert isinstance(verdict, Approval) and verdict.node == "node-a"


def test_an_address_another_node_claims_too_is_signed_for_neither() -> None:
    """A node writes its own status: node-b claiming node-a's address gets no certificate for
    it, and neither does node-a while node-b claims it."""
    claimed = [{"type": "InternalIP", "address": "10.0.0.7"}]
    claimer = {"metadata": {"name": "node-b"}, "status": {"addresses": claimed}}
    verdict = decide(csr(), NODE_A, RULES, [NODE_A, claimer])
    assert verdict == Denial(
        "AddressOfAnotherNode",
        "spec.request asks for 10.0.0.7, which node node-b's status.addresses list too: an "
        "address two nodes claim is signed for neither",
    )
    loopback_only = decide(csr(request=request_of(["127.0.0.1"])), NODE_A, RULES, [claimer])
    assert isinstance(loopback_only, Approval)  # loopback is every node's own
    bystander = {"metadata": {"name": "node-c"}, "status": {"addresses": [
        {"type": "InternalIP", "address": "10.0.0.9"}]}}  # fmt: skip
    assert isinstance(decide(csr(), NODE_A, RULES, [NODE_A, bystander]), Approval)
