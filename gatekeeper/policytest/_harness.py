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
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import yarl
from aiohttp import web

from gatekeeper.apiserver import APIServer, JournalEntry, Store
from gatekeeper.audit import AuditLevel
from gatekeeper.cli.served import served_kinds
from gatekeeper.listen.connections import GuardedRunner
from gatekeeper.policy import Engine
from gatekeeper.policytest._model import MalformedTest, TestCase, TestFile
from gatekeeper.proxy.state import Gatekeeper
from gatekeeper.server.server import socket_path
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import UpstreamSession

__all__ = ["Forwarded", "Harness", "Outcome"]

_TOKEN = "dra-gatekeeper-test-node-token"  # a throwaway credential for the embedded server
_DECISION = "authorization.k8s.io/decision"
_REASON = "authorization.k8s.io/reason"
_ANSWER_TIMEOUT = 30.0
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
    """``async with Harness(test_file) as harness: outcome = await harness.run(case)``."""

    def __init__(self, test_file: TestFile) -> None:
        self.file = test_file
        drivers = {case.driver for case in test_file.cases} | set(test_file.policy.drivers)
        self._drivers = sorted(d for d in drivers if d != "*")
        self.apiserver = APIServer(served_kinds(test_file.policy), token=_TOKEN)
        self._sink = _MemorySink()
        self._runner: GuardedRunner | None = None
        self._upstream: UpstreamSession | None = None
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._socket_dir = Path(tempfile.mkdtemp(prefix="gk-test-"))

    async def __aenter__(self) -> Harness:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _start(self) -> None:
        url = await self.apiserver.start()
        self._upstream = UpstreamSession(UpstreamConfig(server=url, token=_TOKEN))
        await self._upstream.start()
        engine = Engine(self.file.policy, self.file.node, node_labels=dict(self.file.node_labels))
        gatekeeper = Gatekeeper(
            engine=engine,
            upstream=self._upstream,
            audit=self._sink,
            audit_level=AuditLevel.METADATA,
        )
        self._runner = GuardedRunner(gatekeeper, shutdown_timeout=1.0)
        await self._runner.setup()
        for driver in self._drivers:
            # Every driver a case names gets its socket, as if the operator had given each one a
            # directory: a driver the policy does not allow is then refused by the policy itself.
            path = socket_path(self._socket_dir, driver)
            path.parent.mkdir(parents=True)
            await web.UnixSite(self._runner, str(path)).start()
            gatekeeper.socket_drivers[str(path)] = driver
            self._sessions[driver] = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(path)),
                timeout=aiohttp.ClientTimeout(total=_ANSWER_TIMEOUT),
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                auto_decompress=False,
            )

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._upstream is not None:
            await self._upstream.close()
            self._upstream = None
        await self.apiserver.close()
        shutil.rmtree(self._socket_dir, ignore_errors=True)

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

    async def run(self, case: TestCase) -> Outcome:
        """Reset the store for ``case``, send its request as its driver, and observe."""
        self.reset(case)
        loop = asyncio.get_running_loop()
        started = loop.time()
        request = case.request
        try:
            url = yarl.URL("http://localhost" + request.target, encoded=True)
        except ValueError as exc:
            return Outcome(0, "", "", "", None, error=f"cannot send this path: {exc}")
        headers = {"User-Agent": "dra-gatekeeper-test", **dict(request.headers)}
        session = self._sessions[case.driver]
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
        )


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
