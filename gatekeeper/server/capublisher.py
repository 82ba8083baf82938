"""Keeps the ConfigMap holding the gatekeeper's CA bundle current in every namespace of a
ServiceAccount the policy maps to a driver (docs/operating.md#getting-the-ca-to-drivers), and,
with ``bind_role``, the RoleBinding that gives the gatekeeper a policy's DriverNamespace rights
there: made as each namespace appears, so that installing the gatekeeper before a driver's
namespace exists fails nothing.

One writer per cluster (``dra-gatekeeper publish-ca``), never the per-node gatekeepers: a
node's credentials must not be able to replace the CA every driver trusts (DESIGN.md §4.2).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from gatekeeper.errors import ConfigError
from gatekeeper.policyfile import load_policy
from gatekeeper.upstream.kubeconfig import TokenSource, UpstreamConfig, build_ssl_context

__all__ = [
    "BUNDLE_KEY",
    "MANAGED_BY",
    "Outcome",
    "PublishConfig",
    "Publisher",
    "read_bundle",
]

log = logging.getLogger("gatekeeper.publish-ca")

BUNDLE_KEY = "ca.crt"
"""The ConfigMap key a driver's projected service-account volume maps to ``ca.crt``."""
MANAGED_BY = {"app.kubernetes.io/managed-by": "dra-gatekeeper-publish-ca"}
_MAX_BUNDLE = 512 * 1024
_RETRY_SECONDS = 5.0
_TIMEOUT = aiohttp.ClientTimeout(total=30, sock_connect=10)


class Outcome(Enum):
    """What one namespace's reconcile did (a bounded set: log and exit-code facts)."""

    CURRENT = "current"
    CREATED = "created"
    UPDATED = "updated"
    NO_NAMESPACE = "namespace-missing"
    FAILED = "failed"

    @property
    def ok(self) -> bool:
        return self in (Outcome.CURRENT, Outcome.CREATED, Outcome.UPDATED)


@dataclass(frozen=True, slots=True)
class PublishConfig:
    """``publish-ca``'s checked settings."""

    upstream: UpstreamConfig
    policy: str | None
    """The policy file whose ``serviceAccounts`` name the namespaces (None: packaged default)."""
    ca_dir: Path
    """Every ``*.crt`` file in it is published, certificates in file-name order."""
    configmap: str
    resync_seconds: float
    bind_role: str | None = None
    """A ClusterRole to bind to ``bind_subject`` in each namespace (a RoleBinding of its name)."""
    bind_subject: tuple[str, str] = ("", "")
    """The gatekeeper's ServiceAccount (namespace, name) the RoleBinding names."""


def read_bundle(ca_dir: Path) -> str:
    """The PEM bundle of every CA certificate in ``ca_dir/*.crt`` (file-name order, duplicates
    dropped); ConfigError naming the file if one holds a private key, a certificate that is not
    a CA, or nothing readable, or if there is no certificate at all."""
    certificates: list[bytes] = []
    files = sorted(p for p in ca_dir.glob("*.crt") if not p.name.startswith("."))
    for path in files:
        for pem in _certificates(path):
            if pem not in certificates:
                certificates.append(pem)
    if not certificates:
        raise ConfigError(f"--ca-dir {ca_dir}: no certificate in any *.crt file")
    return "".join(pem.decode("ascii") for pem in certificates)


def _certificates(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()[: _MAX_BUNDLE + 1]
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_BUNDLE:
        raise ConfigError(f"{path}: larger than {_MAX_BUNDLE} bytes")
    if b"PRIVATE KEY-----" in data:
        # SECURITY: what is published is readable by every pod of the namespace (DESIGN.md §4.2).
        raise ConfigError(f"{path}: holds a private key; only certificates are published")
    try:
        loaded = x509.load_pem_x509_certificates(data)
    except ValueError:
        raise ConfigError(f"{path}: not a PEM certificate") from None
    for cert in loaded:
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise ConfigError(f"{path}: {cert.subject.rfc4514_string()} is not a CA certificate")
    return [cert.public_bytes(Encoding.PEM) for cert in loaded]


def _signature(paths: Iterable[str | Path]) -> tuple[tuple[str, int, int, int] | None, ...]:
    """What changes when a file (or the kubelet's symlink swap of a volume) changes."""
    marks: list[tuple[str, int, int, int] | None] = []
    for path in sorted(str(p) for p in paths):
        try:
            st = os.stat(path)
        except OSError:
            marks.append(None)
            continue
        marks.append((path, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(marks)


class Publisher:
    """Reconciles the ConfigMap in each mapped namespace: on start, whenever the policy or a CA
    file changes (checked every second), and every ``resync_seconds`` (a ConfigMap deleted or
    edited by hand is put back). A namespace that leaves the policy keeps its ConfigMap (a CA
    certificate is public; the publisher has no delete right)."""

    def __init__(self, config: PublishConfig) -> None:
        self.config = config
        self._token = TokenSource(config.upstream)
        self._ssl = build_ssl_context(config.upstream)
        self._namespaces: tuple[str, ...] = ()
        self._bundle = ""
        self._policy_files: list[str] = []
        self.load()

    def load(self) -> None:
        """Read the policy and the CA bundle; ConfigError keeps the previous ones (a file in
        the middle of a rotation is read again on the next check)."""
        files: list[str] = []
        try:
            policy = load_policy(self.config.policy, files_read=files)
        finally:
            self._policy_files = files or self._policy_files
        bundle = read_bundle(self.config.ca_dir)
        self._namespaces = tuple(sorted({u.split(":")[2] for u in policy.service_accounts}))
        self._bundle = bundle
        digest = hashlib.sha256(bundle.encode()).hexdigest()[:16]
        log.info(
            "ca bundle loaded certificates=%d sha256=%s namespaces=%s",
            bundle.count("BEGIN CERTIFICATE"),
            digest,
            ",".join(self._namespaces) or "-",
        )

    def _files_signature(self) -> tuple[tuple[str, int, int, int] | None, ...]:
        return _signature([*self._policy_files, *self.config.ca_dir.glob("*.crt")])

    async def run(self, stopping: asyncio.Event) -> None:
        """Reconcile until ``stopping`` is set."""
        async with self._session() as session:
            seen = self._files_signature()
            current = await self.reconcile(session)
            last = asyncio.get_running_loop().time()
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=1.0)
                now_seen = self._files_signature()
                changed = now_seen != seen
                if changed:
                    seen = now_seen
                    try:
                        self.load()
                    except ConfigError as exc:
                        log.warning("keeping the previous bundle and namespaces: %s", exc)
                # A pass that left a namespace behind (apiserver away, a conflict) is retried
                # sooner than the resync.
                wait = self.config.resync_seconds
                if not current:
                    wait = min(_RETRY_SECONDS, wait)
                due = asyncio.get_running_loop().time() - last >= wait
                if changed or due:
                    current = await self.reconcile(session)
                    last = asyncio.get_running_loop().time()

    async def once(self) -> bool:
        """One reconcile of every namespace; True if each one's ConfigMap is current."""
        async with self._session() as session:
            return await self.reconcile(session)

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            base_url=self.config.upstream.server,
            timeout=_TIMEOUT,
            connector=aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False),
        )

    async def reconcile(self, session: aiohttp.ClientSession) -> bool:
        """Bring every namespace's ConfigMap to the current bundle; True if all are current."""
        with contextlib.suppress(ConfigError):  # the last good token stays (logged)
            self._token.reload()
        outcomes = [await self._one(session, namespace) for namespace in self._namespaces]
        return all(outcome.ok for outcome in outcomes)

    async def _one(self, session: aiohttp.ClientSession, namespace: str) -> Outcome:
        call = _Caller(session, self._headers(), self.config.upstream.tls_server_name)
        outcome = await self._published(call, namespace)
        if outcome.ok and self.config.bind_role is not None:
            return await self._bound(call, namespace, self.config.bind_role)
        return outcome

    async def _published(self, call: _Caller, namespace: str) -> Outcome:
        """The CA ConfigMap in ``namespace``: made or put back."""
        name = self.config.configmap
        try:
            status, stored = await call("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}")
            if status == 404:
                status, stored = await call(
                    "POST", f"/api/v1/namespaces/{namespace}/configmaps", self._object(None)
                )
                outcome = Outcome.CREATED if status == 201 else _failure(status)
            elif status == 200 and self._is_current(stored):
                return Outcome.CURRENT
            elif status == 200:
                status, stored = await call(
                    "PUT",
                    f"/api/v1/namespaces/{namespace}/configmaps/{name}",
                    self._object(stored),
                )
                outcome = Outcome.UPDATED if status == 200 else _failure(status)
            else:
                outcome = Outcome.FAILED
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning(
                "ca configmap failed namespace=%s name=%s reason=%s",
                namespace,
                name,
                type(exc).__name__,
            )
            return Outcome.FAILED
        _log_outcome(outcome, namespace, name, status, stored)
        return outcome

    async def _bound(self, call: _Caller, namespace: str, role: str) -> Outcome:
        """The RoleBinding ``role`` in ``namespace``: the ClusterRole ``role``, the gatekeeper
        as its one subject; made or put back (its roleRef is immutable: one pointing elsewhere
        is logged, never deleted: the publisher has no delete right)."""
        where = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
        subject_ns, subject = self.config.bind_subject
        wanted: dict[str, Any] = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": role, "labels": dict(MANAGED_BY)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": subject,
                          "namespace": subject_ns}],
        }  # fmt: skip
        try:
            status, stored = await call("GET", f"{where}/{role}")
            if status == 404:
                status, stored = await call("POST", where, wanted)
                outcome = Outcome.CREATED if status == 201 else _failure(status)
            elif status != 200:
                outcome = Outcome.FAILED
            elif stored.get("roleRef") != wanted["roleRef"]:
                outcome, status = Outcome.FAILED, 409
                stored = {"kind": "Status", "reason": "roleRef names another role"}
            elif stored.get("subjects") == wanted["subjects"]:
                return Outcome.CURRENT
            else:
                wanted["metadata"] = {
                    **stored.get("metadata", {}),
                    "labels": {**(stored.get("metadata", {}).get("labels") or {}), **MANAGED_BY},
                }
                status, stored = await call("PUT", f"{where}/{role}", wanted)
                outcome = Outcome.UPDATED if status == 200 else _failure(status)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("rolebinding failed namespace=%s name=%s reason=%s", namespace, role,
                        type(exc).__name__)  # fmt: skip
            return Outcome.FAILED
        _log_outcome(outcome, namespace, role, status, stored, what="rolebinding")
        return outcome

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "dra-gatekeeper-publish-ca"}
        token = self._token.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _is_current(self, stored: dict[str, Any]) -> bool:
        labels = stored.get("metadata", {}).get("labels") or {}
        return bool(
            stored.get("data") == {BUNDLE_KEY: self._bundle}
            and all(labels.get(k) == v for k, v in MANAGED_BY.items())
            and not stored.get("binaryData")
        )

    def _object(self, stored: dict[str, Any] | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.config.configmap, "labels": dict(MANAGED_BY)}
        if stored is not None:
            old = stored.get("metadata", {})
            metadata["labels"] = {**(old.get("labels") or {}), **MANAGED_BY}
            # Pinned: a change in between is a 409, retried on the next pass.
            metadata["resourceVersion"] = old.get("resourceVersion", "")
            if old.get("annotations"):
                metadata["annotations"] = old["annotations"]
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {BUNDLE_KEY: self._bundle},
        }


class _Caller:
    """One JSON request to the apiserver: (status, decoded body)."""

    def __init__(
        self, session: aiohttp.ClientSession, headers: dict[str, str], server_hostname: str | None
    ) -> None:
        self._session = session
        self._headers = headers
        self._server_hostname = server_hostname

    async def __call__(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        async with self._session.request(
            method,
            path,
            json=body,
            headers=self._headers,
            allow_redirects=False,
            server_hostname=self._server_hostname,
        ) as answer:
            data = await answer.read()
            decoded = _decode(data)
            return answer.status, decoded


def _decode(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _failure(status: int) -> Outcome:
    return Outcome.NO_NAMESPACE if status == 404 else Outcome.FAILED


def _log_outcome(
    outcome: Outcome,
    namespace: str,
    name: str,
    status: int,
    body: dict[str, Any],
    *,
    what: str = "ca configmap",
) -> None:
    write: Callable[..., None] = log.info if outcome.ok else log.warning
    if outcome.ok:
        write("%s %s namespace=%s name=%s", what, outcome.value, namespace, name)
        return
    reason = str(body.get("reason") or "") if body.get("kind") == "Status" else ""
    write(
        "%s %s namespace=%s name=%s code=%d reason=%s",
        what,
        outcome.value,
        namespace,
        name,
        status,
        reason or "-",
    )
