"""Connection limits and what aiohttp answers before the gatekeeper's handler runs.

:class:`GuardedRunner` is the aiohttp ``AppRunner`` the server uses. Its connections
(``RequestHandler`` subclass, the one hook aiohttp has for this) enforce:

- a cap on open connections per driver and in total (over it: a 429 Status, then close);
- a header read timeout (slowloris: a request whose headers do not complete in time is
  closed), beside aiohttp's keep-alive idle timeout;
- a Kubernetes Status with an Audit-Id, an audit event and a count for every request aiohttp
  itself refuses (malformed framing, oversized header lines), instead of text/plain.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any, ClassVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gatekeeper.audit import build_event
from gatekeeper.flow import Flow
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.policy import Decision
from gatekeeper.proxy import GATEKEEPER, Gatekeeper
from gatekeeper.scoped import DROPPED
from gatekeeper.status import status_body

__all__ = ["CALLER_ANNOTATION", "ConnectionGuard", "GuardedRunner", "IsolationCollector"]

log = logging.getLogger("gatekeeper.connections")

CALLER_ANNOTATION = "dra-gatekeeper.io/connection-caller"
"""Audit annotation of answers given before a request was read: the driver (socket directory
or certificate CN) or peer whose connection it was."""
_LINGER = 1.0
"""Seconds a refused connection is kept half-closed so the client can read its 429."""


class ConnectionGuard:
    """Counts open connections per caller and refusals; shared by every listener."""

    def __init__(self, gatekeeper: Gatekeeper, limits: Limits = DEFAULT_LIMITS) -> None:
        self.gatekeeper = gatekeeper
        self.limits = limits
        self.open: Counter[str] = Counter()
        self.total = 0
        self.refused = Counter[str]()
        """Connections closed at once as over a cap, per caller."""
        self.malformed = 0
        """Requests aiohttp refused before the handler (answered with a Status)."""
        self.header_timeouts = 0
        """Connections closed because a request's headers did not complete in time."""
        self._tasks: set[asyncio.Task[None]] = set()

    def caller(self, transport: Any) -> str:
        """Who is on ``transport`` for counting: the driver, else the peer (never trusted)."""
        sockname = transport.get_extra_info("sockname")
        if isinstance(sockname, str) and sockname:
            return self.gatekeeper.socket_drivers.get(sockname, f"socket:{sockname}")
        cert = transport.get_extra_info("peercert")
        for rdn in (cert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    return str(value)
        peer = transport.get_extra_info("peername")
        return f"peer:{peer[0] if isinstance(peer, tuple) else peer}"

    def admit(self, caller: str) -> str | None:
        """Count a new connection of ``caller``; the reason to refuse it, or None."""
        if self.total >= self.limits.connections_total:
            why = f"the gatekeeper has {self.total} open connections, its limit"
        elif self.open[caller] >= self.limits.connections_per_driver:
            why = f'"{caller}" has {self.open[caller]} open connections, the most one driver may'
        else:
            self.total += 1
            self.open[caller] += 1
            return None
        self.refused[caller] += 1
        if self.refused[caller] == 1 or self.refused[caller] % 100 == 0:
            log.warning("connection refused caller=%s refused=%d reason=%s", caller,
                        self.refused[caller], why)  # fmt: skip
        return why

    def flow(self, method: str, caller: str) -> Flow:
        """A Flow for an answer given before a request could be read (no identity yet: the
        caller, as counted for connection caps, goes in an annotation)."""
        flow = Flow(
            method=method,
            raw_target="",
            source_ips=(),
            user_agent="",
            node_name=self.gatekeeper.node_name,
        )
        if caller:
            flow.annotations[CALLER_ANNOTATION] = caller
        return flow

    def audit(self, flow: Flow) -> None:
        """Emit ``flow``'s event from a synchronous protocol callback."""
        event = build_event(flow, self.gatekeeper.audit_level)
        task = asyncio.get_running_loop().create_task(self.gatekeeper.audit.emit(event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def release(self, caller: str) -> None:
        self.total -= 1
        self.open[caller] -= 1
        if self.open[caller] <= 0:
            del self.open[caller]


class _GuardedHandler(RequestHandler):
    """aiohttp's connection protocol, with the guard's caps, header timeout and Status errors."""

    guard: ClassVar[ConnectionGuard]
    _caller: str | None = None
    _refused = False
    _refused_transport: asyncio.BaseTransport | None = None
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        caller = self.guard.caller(transport)
        if (why := self.guard.admit(caller)) is not None:
            self._refused = True
            self._refuse(transport, caller, why)
            return
        self._caller = caller
        super().connection_made(transport)

    def _refuse(self, transport: asyncio.BaseTransport, caller: str, why: str) -> None:
        """Answer 429 before reading anything, audit it, and close after a moment."""
        flow = self.guard.flow("", caller)
        text = f"too many connections: {why}"
        flow.decision = Decision(False, "too many connections", 429, text, retry_after=1)
        flow.finish(429, text)
        self.guard.audit(flow)
        body = json.dumps(status_body(429, text, details={"retryAfterSeconds": 1})).encode()
        head = (
            "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
            f"Audit-Id: {flow.audit_id}\r\nRetry-After: 1\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        transport.write(head.encode() + body)  # type: ignore[attr-defined]
        # Half-close and discard what the client still sends for a moment: closing with
        # unread data would reset the connection before the client reads the 429.
        if transport.can_write_eof():  # type: ignore[attr-defined]
            transport.write_eof()  # type: ignore[attr-defined]
        asyncio.get_running_loop().call_later(_LINGER, transport.close)
        self._refused_transport = transport

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return  # never started: nothing of aiohttp's to tear down
        self._cancel_header_timer()
        if self._caller is not None:
            self.guard.release(self._caller)
            self._caller = None
        super().connection_lost(exc)

    def eof_received(self) -> None:
        if self._refused and self._refused_transport is not None:
            self._refused_transport.close()

    def data_received(self, data: bytes) -> None:
        if self._caller is None:
            return  # refused in connection_made: discarded
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._cancel_header_timer()  # a request's headers are complete
        elif self._header_timer is None and not self._request_in_progress:
            loop = asyncio.get_running_loop()
            self._header_timer = loop.call_later(self.guard.limits.header_timeout, self._slow)

    def _slow(self) -> None:
        self._header_timer = None
        self.guard.header_timeouts += 1
        log.warning(
            "closed a connection whose request headers did not arrive within %ss caller=%s",
            self.guard.limits.header_timeout,
            self._caller,
        )
        self.force_close()
        if self.transport is not None:
            self.transport.close()

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse (or a crash it caught): a Status
        with an Audit-Id, logged, counted and audited, instead of text/plain."""
        if request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        reason = " ".join(str(message or exc or "malformed request").split())[:300]
        if status < 500:
            self.guard.malformed += 1
            log.warning("malformed HTTP request refused caller=%s reason=%s", self._caller, reason)
        else:
            log.error("error handling a request caller=%s", self._caller, exc_info=exc)
        flow = self.guard.flow(request.method, self._caller or "")
        text = f"malformed HTTP request: {reason}" if status < 500 else "internal error"
        if status < 500:
            flow.decision = Decision(False, text, status, text)
        flow.finish(status, text)
        body = status_body(status, text)
        self.guard.audit(flow)
        response = web.json_response(body, status=status, headers={"Audit-Id": flow.audit_id})
        response.force_close()
        return response


class _GuardedServer(Server):
    """aiohttp's protocol factory, making :class:`_GuardedHandler` connections."""

    handler_class: type[_GuardedHandler] = _GuardedHandler

    def __call__(self) -> RequestHandler:
        return self.handler_class(self, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """``web.AppRunner`` for the gatekeeper app: connections follow ``limits``."""

    def __init__(self, app: web.Application, limits: Limits = DEFAULT_LIMITS, **kwargs: Any):
        kwargs.setdefault("keepalive_timeout", limits.keepalive_timeout)
        super().__init__(app, **kwargs)
        self.guard = ConnectionGuard(app[GATEKEEPER], limits)

    async def _make_server(self) -> Server:
        server = await super()._make_server()
        # aiohttp has no public hook for the connection class: one subclass per runner, made
        # here, carries the guard.
        handler = type("GatekeeperConnection", (_GuardedHandler,), {"guard": self.guard})
        server.__class__ = _GuardedServer
        server.handler_class = handler  # type: ignore[attr-defined]
        return server


class IsolationCollector(Collector):
    """``/metrics`` for what no audit event counts: connections refused or cut, objects
    dropped from filtered answers, open connections per caller."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard

    def collect(self) -> Iterator[Any]:
        guard = self._guard
        yield _by_caller(
            CounterMetricFamily(
                "dra_gatekeeper_connections_refused",
                "Connections answered 429 and closed at once (over a connection cap), by caller.",
                labels=["caller"],
            ),
            guard.refused,
        )
        yield _total(
            CounterMetricFamily(
                "dra_gatekeeper_header_timeouts",
                "Connections closed because a request's headers did not arrive in time.",
            ),
            guard.header_timeouts,
        )
        yield _total(
            CounterMetricFamily(
                "dra_gatekeeper_malformed_requests",
                "Requests aiohttp could not parse (answered with a Status and audited).",
            ),
            guard.malformed,
        )
        yield _total(
            CounterMetricFamily(
                "dra_gatekeeper_unevaluable_objects_dropped",
                "Objects left out of filtered answers because they could not be evaluated.",
            ),
            DROPPED.value,
        )
        yield _by_caller(
            GaugeMetricFamily(
                "dra_gatekeeper_connections_open",
                "Open driver connections, by caller.",
                labels=["caller"],
            ),
            guard.open,
        )


def _total(family: CounterMetricFamily, value: int) -> CounterMetricFamily:
    family.add_metric([], float(value))
    return family


def _by_caller(
    family: CounterMetricFamily | GaugeMetricFamily, counts: Counter[str]
) -> CounterMetricFamily | GaugeMetricFamily:
    for caller, count in counts.items():
        family.add_metric([caller], float(count))
    return family
