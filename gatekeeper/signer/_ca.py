"""The signer's CA: kept in one Secret that only the signer reads (through the API: no pod
mounts it, so no kubelet fetches it onto a node), made there at the first start, and its
certificates published in a ConfigMap beside it for ``publish-ca`` to hand to the drivers.

Secret keys: ``ca.crt`` and ``ca.key`` (the CA that signs), and during a rotation ``trust.crt``
(more CA certificates drivers must trust meanwhile: docs/operating.md#rotating-the-ca).
ConfigMap keys: ``ca.crt`` and, when the Secret has one, ``trust.crt`` — certificates only.
Both objects are made empty by the chart or kustomization (so the signer needs no right to
create Secrets): the signer only gets and updates these two names.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
from dataclasses import dataclass, field

from gatekeeper.codec import pki
from gatekeeper.errors import ConfigError, UpstreamError
from gatekeeper.types import KubeObject
from gatekeeper.upstream.session import Upstream, request

__all__ = ["CA_CERT", "CA_KEY", "TRUST_CERT", "HeldCA", "load_ca", "publish_certificates"]

log = logging.getLogger("gatekeeper.signer")

CA_CERT, CA_KEY, TRUST_CERT = "ca.crt", "ca.key", "trust.crt"


@dataclass(frozen=True, slots=True)
class HeldCA:
    """The CA that signs, the certificates to publish, and the Secret's version read."""

    ca: pki.IssuedCert = field(repr=False)
    trust: bytes
    """More CA certificates to publish (PEM; empty outside a rotation)."""
    version: str

    @property
    def published(self) -> dict[str, str]:
        """The ConfigMap's data: certificates only."""
        data = {CA_CERT: self.ca.cert_pem.decode("ascii")}
        if self.trust:
            data[TRUST_CERT] = self.trust.decode("ascii")
        return data

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.ca.cert_pem).hexdigest()[:16]


def _path(namespace: str, plural: str, name: str) -> str:
    # Checked names (the command's flags: a namespace, DNS subdomains): nothing to escape.
    return f"/api/v1/namespaces/{namespace}/{plural}/{name}"


async def load_ca(
    upstream: Upstream, namespace: str, secret: str, *, days: int, common_name: str
) -> HeldCA:
    """The CA of Secret ``namespace/secret``; a new one (``days`` long) written there when it
    holds none yet. ConfigError when the Secret is missing, unreadable or holds a broken CA;
    UpstreamError when the apiserver cannot be asked."""
    path = _path(namespace, "secrets", secret)
    code, stored = await request(upstream, "GET", path)
    if code == 404:
        raise ConfigError(
            f"Secret {namespace}/{secret} does not exist: the chart and deploy/signer.yaml "
            "create it (empty); the signer fills it"
        )
    if code != 200:
        raise ConfigError(f"cannot read Secret {namespace}/{secret}: HTTP {code} ({_why(stored)})")
    data = stored.get("data") if isinstance(stored.get("data"), dict) else {}
    assert isinstance(data, dict)
    if CA_CERT not in data and CA_KEY not in data:
        return await _create(upstream, path, stored, days=days, common_name=common_name)
    try:
        cert, key = _decoded(data, CA_CERT), _decoded(data, CA_KEY)
        ca = pki.load_ca_pair(cert, key)
        trust = _decoded(data, TRUST_CERT) if TRUST_CERT in data else b""
    except ValueError as exc:
        raise ConfigError(f"Secret {namespace}/{secret}: {exc}") from None
    version = str(stored.get("metadata", {}).get("resourceVersion", ""))
    return HeldCA(ca, trust, version)


async def _create(
    upstream: Upstream, path: str, stored: KubeObject, *, days: int, common_name: str
) -> HeldCA:
    ca = pki.create_ca(common_name, days=days)
    body = dict(stored)
    body["type"] = stored.get("type", "Opaque")
    body["data"] = {
        CA_CERT: base64.b64encode(ca.cert_pem).decode("ascii"),
        CA_KEY: base64.b64encode(ca.key_pem).decode("ascii"),
    }
    # Pinned to the version read: two signers starting at once make one CA, not two.
    code, written = await request(upstream, "PUT", path, body)
    if code != 200:
        raise UpstreamError(502, f"cannot write the new CA into {path}: HTTP {code}")
    version = str(written.get("metadata", {}).get("resourceVersion", ""))
    held = HeldCA(ca, b"", version)
    log.info("ca created secret=%s days=%d sha256=%s", path, days, held.fingerprint)
    return held


async def publish_certificates(
    upstream: Upstream, namespace: str, configmap: str, held: HeldCA
) -> bool:
    """Make ConfigMap ``namespace/configmap`` hold the CA's certificates; True if it changed.
    UpstreamError when it cannot be read or written (retried by the caller)."""
    path = _path(namespace, "configmaps", configmap)
    code, stored = await request(upstream, "GET", path)
    if code != 200:
        raise UpstreamError(
            502,
            f"cannot read ConfigMap {namespace}/{configmap}: HTTP {code} ({_why(stored)}); the "
            "chart and deploy/signer.yaml create it (empty)",
        )
    if stored.get("data") == held.published and not stored.get("binaryData"):
        return False
    body = {**stored, "data": held.published}
    body.pop("binaryData", None)
    code, answer = await request(upstream, "PUT", path, body)
    if code != 200:
        raise UpstreamError(
            502, f"cannot write ConfigMap {namespace}/{configmap}: HTTP {code} ({_why(answer)})"
        )
    log.info("ca certificates published configmap=%s/%s keys=%s", namespace, configmap,
             ",".join(sorted(held.published)))  # fmt: skip
    return True


def _decoded(data: dict[str, object], key: str) -> bytes:
    try:
        return base64.b64decode(str(data.get(key) or ""), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"data.{key} is not base64") from None


def _why(answer: KubeObject) -> str:
    return str(answer.get("message", "")) if isinstance(answer, dict) else ""
