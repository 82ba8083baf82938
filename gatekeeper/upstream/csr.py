"""The CertificateSigningRequest exchange (certificates.k8s.io/v1): a request made, read, and
answered (approved or denied, then signed or failed), with whatever credentials ``upstream``
carries. The objects stay the apiserver's JSON; :class:`CSRState` is what one says so far.

Both sides use it: the token listener asks for its serving certificate
(:mod:`gatekeeper.listen.servingcert`), the signer answers (:mod:`gatekeeper.signer`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from gatekeeper.errors import UpstreamError
from gatekeeper.names import is_dns_subdomain
from gatekeeper.types import KubeObject
from gatekeeper.upstream.session import Upstream, request

__all__ = [
    "CSRS",
    "CSRState",
    "Verdict",
    "answer_csr",
    "create_csr",
    "csr_path",
    "read_csr",
    "sign_csr",
]

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


class Verdict(Enum):
    """Where a request stands (its conditions, as the apiserver keeps them)."""

    PENDING = "Pending"
    APPROVED = "Approved"
    """Approved, not signed yet (or signed: :attr:`CSRState.certificate` is set)."""
    DENIED = "Denied"
    FAILED = "Failed"


@dataclass(frozen=True, slots=True)
class CSRState:
    """One request as the apiserver answered it: its name, where it stands, the condition's
    reason and message (the signer's words), and the certificate once signed (PEM)."""

    name: str
    verdict: Verdict
    reason: str = ""
    message: str = ""
    certificate: bytes = b""

    @classmethod
    def of(cls, obj: KubeObject) -> CSRState:
        name = str(obj.get("metadata", {}).get("name", ""))
        status = obj.get("status") if isinstance(obj.get("status"), dict) else {}
        assert isinstance(status, dict)
        found: dict[str, dict[str, Any]] = {}
        for condition in status.get("conditions") or ():
            if isinstance(condition, dict) and condition.get("status", "True") == "True":
                found.setdefault(str(condition.get("type", "")), condition)
        verdict, condition = Verdict.PENDING, {}
        # A Denied or Failed request is never signed; an Approved one waits for its certificate.
        for candidate in (Verdict.DENIED, Verdict.FAILED, Verdict.APPROVED):
            if candidate.value in found:
                verdict, condition = candidate, found[candidate.value]
                break
        try:
            certificate = base64.b64decode(str(status.get("certificate") or ""), validate=True)
        except (binascii.Error, ValueError):
            certificate = b""
        return cls(
            name,
            verdict,
            str(condition.get("reason", "")),
            str(condition.get("message", "")),
            certificate,
        )

    @property
    def issued(self) -> bool:
        return self.verdict is Verdict.APPROVED and bool(self.certificate)


def csr_path(name: str) -> str:
    """The request's path; ValueError for a name that is no DNS subdomain (a request's name
    may hold more, such a path segment the gatekeeper never writes)."""
    if not is_dns_subdomain(name):
        raise ValueError(f"CertificateSigningRequest name {name[:80]!r} is not a DNS subdomain")
    return f"{CSRS}/{name}"


async def create_csr(
    upstream: Upstream,
    request_pem: bytes,
    signer_name: str,
    usages: tuple[str, ...],
    *,
    generate_name: str,
    labels: dict[str, str] | None = None,
) -> CSRState:
    """Create a request for ``request_pem`` (PKCS#10) of ``signer_name``; the apiserver fills
    in who asked (``spec.username``, ``groups``, ``extra``) from the credentials."""
    metadata: dict[str, Any] = {"generateName": generate_name}
    if labels:
        metadata["labels"] = labels
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": metadata,
        "spec": {
            "request": base64.b64encode(request_pem).decode("ascii"),
            "signerName": signer_name,
            "usages": list(usages),
        },
    }
    code, answer = await request(upstream, "POST", CSRS, body)
    if code != 201:
        raise _failed("create a CertificateSigningRequest", code, answer, "create")
    return CSRState.of(answer)


async def read_csr(upstream: Upstream, name: str) -> CSRState | None:
    """The request ``name`` as it stands; None once it is gone (deleted, or cleaned up)."""
    code, answer = await request(upstream, "GET", csr_path(name))
    if code == 404:
        return None
    if code != 200:
        raise _failed(f"read CertificateSigningRequest {name}", code, answer, "get")
    return CSRState.of(answer)


async def answer_csr(
    upstream: Upstream, csr: KubeObject, verdict: Verdict, reason: str, message: str
) -> KubeObject:
    """Approve or deny ``csr`` (its ``approval`` subresource), pinned to the version read."""
    assert verdict in (Verdict.APPROVED, Verdict.DENIED)
    return await _condition(upstream, csr, "approval", verdict, reason, message)


async def sign_csr(
    upstream: Upstream,
    csr: KubeObject,
    certificate_pem: bytes | None,
    *,
    reason: str = "",
    message: str = "",
) -> KubeObject:
    """Set the certificate of an approved ``csr`` (its ``status``), or, with None, the Failed
    condition saying why it was not signed."""
    if certificate_pem is None:
        return await _condition(upstream, csr, "status", Verdict.FAILED, reason, message)
    body = dict(csr)
    status = dict(body.get("status") or {})
    status["certificate"] = base64.b64encode(certificate_pem).decode("ascii")
    body["status"] = status
    return await _update(upstream, body, "status")


async def _condition(
    upstream: Upstream, csr: KubeObject, sub: str, verdict: Verdict, reason: str, message: str
) -> KubeObject:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {
        "type": verdict.value,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastUpdateTime": now,
        "lastTransitionTime": now,
    }
    body = dict(csr)
    status = dict(body.get("status") or {})
    status["conditions"] = [*(status.get("conditions") or ()), condition]
    body["status"] = status
    return await _update(upstream, body, sub)


async def _update(upstream: Upstream, body: KubeObject, sub: str) -> KubeObject:
    name = str(body.get("metadata", {}).get("name", ""))
    # An item of a list or a watch event carries no kind: the update names it.
    body = {**body, "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest"}
    code, answer = await request(upstream, "PUT", f"{csr_path(name)}/{sub}", body)
    if code != 200:
        raise _failed(f"update CertificateSigningRequest {name}/{sub}", code, answer, "update")
    return answer


def _failed(what: str, code: int, answer: KubeObject, verb: str) -> UpstreamError:
    message = answer.get("message", "") if isinstance(answer, dict) else ""
    hint = f" (its credentials need {verb} on it: deploy/README.md)" if code == 403 else ""
    return UpstreamError(502, f"cannot {what}: HTTP {code}: {message}{hint}")
