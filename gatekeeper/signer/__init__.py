"""``dra-gatekeeper signer``: the one holder of the token listener's CA key, off the worker
nodes, signing each gatekeeper's serving certificate for its own node's addresses only
(docs/security.md, "Key custody")."""

from gatekeeper.signer._ca import CA_CERT, CA_KEY, TRUST_CERT, HeldCA, load_ca, publish_certificates
from gatekeeper.signer._rules import (
    LOOPBACK,
    Approval,
    Denial,
    Requested,
    SignerRules,
    addresses_of,
    decide,
    node_of,
    read_request,
)
from gatekeeper.signer._signer import APPROVED_REASON, Signer, SignerConfig

__all__ = [
    "APPROVED_REASON",
    "CA_CERT",
    "CA_KEY",
    "LOOPBACK",
    "TRUST_CERT",
    "Approval",
    "Denial",
    "HeldCA",
    "Requested",
    "Signer",
    "SignerConfig",
    "SignerRules",
    "addresses_of",
    "decide",
    "load_ca",
    "node_of",
    "publish_certificates",
    "read_request",
]
