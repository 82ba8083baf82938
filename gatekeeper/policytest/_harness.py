"""One test file's world: the embedded API server, a real gatekeeper in front of it, and one
Unix socket per driver; each case runs against a freshly reset store.

The request goes through the gatekeeper's real pipeline (:mod:`gatekeeper.proxy.pipeline`) over
a real Unix socket listener; what it decided comes from its own audit event, and what the
upstream received from the embedded API server's journal (the entry carrying the request's
Audit-ID).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import yarl

from gatekeeper.apiserver import TOKEN_KINDS, APIServer, JournalEntry, Store
from gatekeeper.audit import AuditLevel
from gatekeeper.audit.event import VALIDATION_ANNOTATION
from gatekeeper.cli.certs import create_ca, issue_server_cert, write_pem
from gatekeeper.cli.served import served_kinds
from gatekeeper.limits import DEFAULT_LIMITS
from gatekeeper.policytest._model import MalformedTest, TestCase, TestFile
from gatekeeper.server.config import AuditSettings, ServeConfig, token_ssl_context
from gatekeeper.server.server import GatekeeperServer, socket_path
from gatekeeper.upstream.kubeconfig import UpstreamConfig

__all__ = ["Forwarded", "Harness", "Outcome"]

_TOKEN = "dra-gatekeeper-test-node-token"  # a throwaway credential for the embedded server
_DECISION = "authorization.k8s.io/decision"
_REASON = "authorization.k8s.io/reason"
_ANSWER_TIMEOUT = 30.0
_UNLIMITED = 1e9
_EVENT_TIMEOUT = 5.0
# Set by the transport or the gatekeeper on every request: noise in a diff (the token: a secret).
_NOT_SHOWN = frozenset({"authorization", "host", "audit-id", "content-length"})
_TRUE = frozenset({"1", "t", "T", "true", "True", "TRUE"})


@dataclass(frozen=True, slots=True)
class Forwarded:
    """One request as the upstream received it (query decoded, body parsed when JSON)."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: Any

    def as_dict(self) -> dict[str, Any]:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _NOT_SHOWN}
        out: dict[str, Any] = {"method": self.method, "path": self.path}
        if self.query:
            out["query"] = dict(self.query)
        out["headers"] = headers
        if self.body is not None:
            out["body"] = self.body
        return out


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one case's request."""

    code: int
    decision: str
    """``allow``/``forbid`` from the gatekeeper's audit event ("" if it recorded none)."""
    reason: str
    message: str
    """The Status message of the answer ("" when the answer is not a Status)."""
    forwarded: Forwarded | None
    seconds: float = 0.0
    error: str = ""
    """The runner could not complete the request (no answer in time, unsendable target)."""
    validation: str = ""
    """The policy's CEL validation that refused (the audit annotation), if one did."""


class _MemorySink:
    """An audit sink keeping the events of the current case, so a case can wait for its own."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()

    @property
    def writable(self) -> bool:
        return True

    async def emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._arrived.set()

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def final_event(self, audit_id: str, timeout: float) -> dict[str, Any] | None:
        """The ResponseComplete event of ``audit_id`` (else its last event) once it is written."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            mine = [e for e in self.events if e.get("auditID") == audit_id]
            if any(e.get("stage") == "ResponseComplete" for e in mine):
                return next(e for e in mine if e.get("stage") == "ResponseComplete")
            remaining = deadline - loop.time()
            if remaining <= 0:
                return mine[-1] if mine else None
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)


class Harness:
    """``async with Harness(test_file) as harness: outcome = await harness.run(case)``.

    The gatekeeper is the one ``serve`` runs (:class:`~gatekeeper.server.server.GatekeeperServer`
    built from a :class:`~gatekeeper.server.config.ServeConfig`): its listeners, limits and
    pipeline. Every driver a case names gets its Unix socket; a case with a ``token`` is sent
    with that ServiceAccount's token to the token listener.
    """

    def __init__(self, test_file: TestFile, audit_level: AuditLevel = AuditLevel.METADATA) -> None:
        self.file = test_file
        self._audit_level = audit_level
        drivers = {case.driver for case in test_file.cases if case.token is None}
        self._drivers = sorted((drivers | set(test_file.policy.drivers)) - {"*"})
        self._tokens = any(case.token is not None for case in test_file.cases)
        policy_kinds = served_kinds(test_file.policy)
        served = {(kind.group, kind.resource) for kind in policy_kinds}
        # TokenRequest needs ServiceAccounts and Pods stored, served or not by the policy.
        extra = [k for k in TOKEN_KINDS if self._tokens and (k.group, k.resource) not in served]
        self.apiserver = APIServer((*policy_kinds, *extra), token=_TOKEN)
        self._sink = _MemorySink()
        self._server: GatekeeperServer | None = None
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._token_session: aiohttp.ClientSession | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="gk-test-"))

    async def __aenter__(self) -> Harness:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def _start(self) -> None:
        url = await self.apiserver.start()
        socket_dir = self._dir / "sockets"
        socket_dir.mkdir()
        token_tls = None
        if self._tokens:
            cert, key = _throwaway_server_cert(self._dir)
            token_tls = token_ssl_context(cert, key)
        config = ServeConfig(
            node_name=self.file.node,
            policy=self.file.policy,
            upstream=UpstreamConfig(server=url, token=_TOKEN),
            node_labels=dict(self.file.node_labels),
            socket_dir=socket_dir,
            listen_token=("127.0.0.1", 0) if self._tokens else None,
            token_tls=token_tls,
            token_cache_ttl=0.001,  # every case reviews its token: cases are independent
            # Every token case shows a new token: the rate limits against floods of unknown
            # tokens (docs/security.md) would refuse the file's cases, not an attacker.
            limits=replace(
                DEFAULT_LIMITS,
                token_reviews=_UNLIMITED,
                token_reviews_per_source=_UNLIMITED,
                token_reviews_per_connection=_UNLIMITED,
                token_refusals_per_connection=_UNLIMITED,
            ),
            audit=AuditSettings(level=self._audit_level),
        )
        self._server = GatekeeperServer(config, audit=self._sink)
        await self._server.start()
        # Every driver a case names gets its socket, as if the operator had given each one a
        # directory: a driver the policy does not allow is then refused by the policy itself.
        await self._server.add_driver_sockets(
            [d for d in self._drivers if d not in self.file.policy.drivers]
        )
        for driver in self._drivers:
            self._sessions[driver] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(socket_path(socket_dir, driver))),
                timeout=aiohttp.ClientTimeout(total=_ANSWER_TIMEOUT),
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                auto_decompress=False,
            )
        if self._tokens:
            context = ssl.create_default_context(cafile=str(self._dir / "ca.crt"))
            self._token_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=context),
                timeout=aiohttp.ClientTimeout(total=_ANSWER_TIMEOUT),
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                auto_decompress=False,
            )

    async def close(self) -> None:
        sessions = [*self._sessions.values(), self._token_session]
        for session in sessions:
            if session is not None:
                await session.close()
        self._sessions.clear()
        self._token_session = None
        if self._server is not None:
            await self._server.stop()
            self._server = None
        await self.apiserver.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    @property
    def events(self) -> list[dict[str, Any]]:
        """The audit events of the case run last, as the gatekeeper wrote them."""
        return list(self._sink.events)

    def reset(self, case: TestCase) -> None:
        """An empty store holding only ``case.existing``, an empty journal, no events."""
        server = self.apiserver
        server.store.close()  # ends watches left by the previous case
        server.store = Store((kind.group, kind.resource) for kind in server.kinds)
        for obj, line in case.existing:
            try:
                server.add(obj)
            except Exception as exc:  # the server refuses the object: the test file is wrong
                raise MalformedTest(
                    self.file.path, line, str(exc), case=case.name, key="existing"
                ) from exc
        server.journal.clear()
        self._sink.events.clear()

    def _token(self, case: TestCase) -> str:
        """A token of the case's ServiceAccount, bound to its pod (both stored if absent)."""
        spec = case.token
        assert spec is not None
        server = self.apiserver
        stored = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
                  for o, _ in case.existing}  # fmt: skip
        if ("ServiceAccount", spec.namespace, spec.name) not in stored:
            server.add(_service_account(spec.namespace, spec.name))
        if spec.pod and ("Pod", spec.namespace, spec.pod) not in stored:
            server.add(_pod(spec.namespace, spec.pod, spec.name, spec.node or self.file.node))
        server.journal.clear()
        return server.tokens.mint(spec.namespace, spec.name, pod=spec.pod or None)

    async def run(self, case: TestCase, before: Callable[[], object] | None = None) -> Outcome:
        """Reset the store for ``case``, send its request as its driver, and observe;
        ``before`` is called once the store holds ``case.existing``, before the request."""
        self.reset(case)
        if before is not None:
            before()
        loop = asyncio.get_running_loop()
        started = loop.time()
        request = case.request
        headers = {"User-Agent": "dra-gatekeeper-test", **dict(request.headers)}
        if case.token is not None:
            assert self._token_session is not None and self._server is not None
            headers["Authorization"] = f"Bearer {self._token(case)}"
            session, base = self._token_session, f"https://127.0.0.1:{self._server.token_port}"
        else:
            session, base = self._sessions[case.driver], "http://localhost"
        try:
            url = yarl.URL(base + request.target, encoded=True)
        except ValueError as exc:
            return Outcome(0, "", "", "", None, error=f"cannot send this path: {exc}")
        try:
            async with session.request(
                request.method, url, headers=headers, data=request.body, allow_redirects=False
            ) as response:
                code, audit_id = response.status, response.headers.get("Audit-Id", "")
                if _is_watch(request.target) and code == 200:
                    body = b""  # a stream: its status is the answer; close it
                    response.close()
                else:
                    body = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Outcome(0, "", "", "", None, error=f"no answer: {type(exc).__name__} {exc}")
        event = await self._sink.final_event(audit_id, _EVENT_TIMEOUT) if audit_id else None
        annotations = (event or {}).get("annotations") or {}
        return Outcome(
            code=code,
            decision=annotations.get(_DECISION, ""),
            reason=annotations.get(_REASON, ""),
            message=_status_message(body),
            forwarded=_forwarded(self.apiserver.journal, audit_id),
            seconds=loop.time() - started,
            validation=annotations.get(VALIDATION_ANNOTATION, ""),
        )


def _throwaway_server_cert(directory: Path) -> tuple[str, str]:
    """A CA and a serving certificate for 127.0.0.1 in ``directory`` (removed with it)."""
    ca = create_ca()
    write_pem(directory / "ca.crt", ca.cert_pem)
    server = issue_server_cert(ca)
    write_pem(directory / "server.crt", server.cert_pem)
    write_pem(directory / "server.key", server.key_pem, private=True)
    return str(directory / "server.crt"), str(directory / "server.key")


def _service_account(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": namespace},
    }


def _pod(namespace: str, name: str, account: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "serviceAccountName": account},
    }


def _is_watch(target: str) -> bool:
    query = urlsplit(target).query
    return any(k == "watch" and v in _TRUE for k, v in parse_qsl(query, keep_blank_values=True))


def _status_message(body: bytes) -> str:
    try:
        doc = json.loads(body)
    except ValueError:
        return ""
    if isinstance(doc, dict) and doc.get("kind") == "Status":
        return str(doc.get("message", ""))
    return ""


def _forwarded(journal: list[JournalEntry], audit_id: str) -> Forwarded | None:
    """The last request the upstream received on behalf of ``audit_id`` (None: nothing)."""
    for entry in reversed(journal):
        sent = next((v for k, v in entry.headers.items() if k.lower() == "audit-id"), None)
        if audit_id and sent == audit_id:
            return _as_forwarded(entry)
    return None


def _as_forwarded(entry: JournalEntry) -> Forwarded:
    query: dict[str, str] = {}
    for key, value in parse_qsl(entry.query_string, keep_blank_values=True):
        query[key] = f"{query[key]}&{value}" if key in query else value
    body: Any = None
    if entry.body:
        try:
            body = json.loads(entry.body)
        except ValueError:
            body = entry.body.decode("utf-8", "replace")
    return Forwarded(entry.method, entry.path, query, dict(entry.headers), body)
