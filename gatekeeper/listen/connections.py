"""Connection limits and what aiohttp answers before the gatekeeper's handler runs.

:class:`GuardedRunner` is the aiohttp ``AppRunner`` the server uses. Its connections
(a ``RequestHandler`` subclass, made by the runner's ``web.Server``) enforce:

- caps on open connections, kept per listener kind (Unix sockets, mTLS) so that no listener
  takes another's capacity: per driver and in total; over them a 429 Status, then close;
- a small bucket per listener for connections that are not (yet) a driver's: TLS handshakes in
  progress (counted from accept by :mod:`gatekeeper.listen.tlsgate`) and certificates naming no
  driver. It never takes a driver's capacity; when it is full the oldest is closed. Its key
  and a driver's are never a value the client chose (a source address, the CN of a
  certificate that names no driver);
- a header read timeout (slowloris: a request whose headers do not complete in time is
  closed), beside aiohttp's keep-alive idle timeout;
- a Kubernetes Status with an Audit-Id, an audit event and a count for every request aiohttp
  itself refuses (malformed framing, oversized header lines), instead of text/plain.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import StreamReader, web
from aiohttp.abc import AbstractAccessLogger, AbstractStreamWriter
from aiohttp.http import RawRequestMessage
from aiohttp.web import BaseRequest, RequestHandler, Server

from gatekeeper.audit.flow import Client
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.listen.capacity import UNAUTHENTICATED, ConnectionGuard, Ticket
from gatekeeper.listen.identity import Connection, Identifier, ReviewCaller, source_key
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy import Decision
from gatekeeper.proxy.pipeline import Handler, build_handler
from gatekeeper.rule import Rule
from gatekeeper.status import status_body

__all__ = ["GuardedRunner"]

log = logging.getLogger("gatekeeper.connections")

_LINGER = 1.0
"""Seconds a refused connection is kept half-closed so the client can read its 429."""


class _GuardedHandler(RequestHandler, Connection):
    """aiohttp's connection protocol, with the guard's caps, header timeout and Status errors."""

    ticket: Ticket | None = None
    """How this connection is counted: set at accept by the TLS site (unauthenticated), else
    in :meth:`connection_made`; :meth:`ConnectionGuard.attribute` moves it to a driver."""
    client: Client | None = None
    """Who this connection is, known when it was made (read by every request on it)."""
    reviews: ReviewCaller
    """This connection in the token listener's review budget (its address, its buckets)."""

    def __init__(
        self, manager: Server, guard: ConnectionGuard, identifier: Identifier, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        self.identifier = identifier
        self._refused = False
        self._refused_transport: asyncio.BaseTransport | None = None
        self._header_timer: asyncio.TimerHandle | None = None
        self._answering = False
        """From the moment a request's headers are complete until its answer is written."""

    @property
    def _caller(self) -> str | None:
        return None if self.ticket is None else self.ticket.caller

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = client = self.identifier.client_of(transport)
        token = client.listener is ListenerKind.TOKEN
        peer = transport.get_extra_info("peername") if token else None
        self.reviews = ReviewCaller(source_key(peer[0] if isinstance(peer, tuple) else None))
        listener, driver = client.listener, self.guard.driver_of(client)
        ticket, why = self.ticket, ""
        if ticket is not None and not ticket.counted:
            # Closed to make room while its handshake ended: the close is on its way.
            self._refused = True
            transport.close()
            return
        if ticket is not None:
            ticket.close = transport.close  # the TLS connection now, not the raw one
            if driver is not None:
                why = self.guard.attribute(ticket, driver) or ""
        elif driver is None:
            ticket = self.guard.admit_unauthenticated(listener, transport.close)
        else:
            admitted = self.guard.admit(listener, driver, transport.close)
            ticket, why = (None, admitted) if isinstance(admitted, str) else (admitted, "")
        if why:
            self.ticket = None
            self._refused = True
            self._refuse(transport, driver or UNAUTHENTICATED, why)
            return
        self.ticket = ticket
        super().connection_made(transport)

    def attribute(self, driver: str) -> str | None:
        """A token listener's connection, once a request showed whose it is: counted as that
        driver's from now on (None), or the reason it is refused, over the driver's caps (the
        connection then closes after this answer). Counted once: a later request with another
        driver's token is identified as that driver, the connection stays counted as the first.
        """
        ticket = self.ticket
        if ticket is None or ticket.caller != UNAUTHENTICATED:
            return None
        why = self.guard.attribute(ticket, driver)
        if why:
            self.ticket = None
            self.force_close()
        return why

    def _refuse(self, transport: asyncio.BaseTransport, caller: str, why: str) -> None:
        """Answer 429 before reading anything, audit it, and close after a moment."""
        flow = self.guard.flow("", caller)
        text = f"too many connections: {why}"
        flow.decision = Decision(
            False, "too many connections", 429, text, retry_after=1, rule=Rule.RATE_LIMITED
        )
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
        if self.ticket is not None:
            self.guard.release(self.ticket)
        super().connection_lost(exc)

    def eof_received(self) -> None:
        if self._refused and self._refused_transport is not None:
            self._refused_transport.close()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # refused in connection_made: discarded
        super().data_received(data)
        if self._header_timer is None and not self._answering:
            # A request has begun (or ended, its headers complete: request_started is called
            # before anything else runs on this connection, and cancels the timer).
            loop = asyncio.get_running_loop()
            self._header_timer = loop.call_later(self.guard.limits.header_timeout, self._slow)

    def request_started(self) -> None:
        """A request's headers are complete: no header timeout until its answer is written."""
        self._answering = True
        self._cancel_header_timer()

    def request_answered(self) -> None:
        """The answer is written: the next request's headers are timed from its first byte."""
        self._answering = False

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
            flow.decision = Decision(False, text, status, text, rule=Rule.MALFORMED_HTTP)
        flow.finish(status, text)
        body = status_body(status, text)
        self.guard.audit(flow)
        response = web.json_response(body, status=status, headers={"Audit-Id": flow.audit_id})
        response.force_close()
        return response


class _GuardedServer(Server):
    """aiohttp's low-level server, making :class:`_GuardedHandler` connections that all run
    the one pipeline handler (no router: every request target reaches it)."""

    def __init__(
        self, guard: ConnectionGuard, identifier: Identifier, handler: Handler, **kwargs: Any
    ) -> None:
        loop = asyncio.get_running_loop()
        super().__init__(handler, handler_cancellation=True, loop=loop)
        self.guard = guard
        self.identifier = identifier
        self.connection_arguments = {"loop": loop, **kwargs}
        """What every connection is made with (aiohttp's ``RequestHandler`` arguments)."""
        made = self.request_factory

        def request_factory(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: RequestHandler,
            writer: AbstractStreamWriter,
            task: asyncio.Task[None],
        ) -> BaseRequest:
            # Called when a request's headers are complete, before its handler runs.
            if isinstance(protocol, _GuardedHandler):
                protocol.request_started()
            return made(message, payload, protocol, writer, task)

        self.request_factory = request_factory

    def __call__(self) -> RequestHandler:
        return _GuardedHandler(self, self.guard, self.identifier, **self.connection_arguments)


class _Answered(AbstractAccessLogger):
    """aiohttp's hook after an answer is written (its access log): the connection's next
    request is timed from its first byte."""

    def log(self, request: BaseRequest, response: web.StreamResponse, time: float) -> None:
        if isinstance(connection := request.protocol, _GuardedHandler):
            connection.request_answered()


class GuardedRunner(web.ServerRunner):
    """The runner of the gatekeeper's listeners: its connections follow ``limits``, carry the
    :class:`~gatekeeper.audit.flow.Client` ``identifier`` made of them, and every request on
    them takes the pipeline composed once (:func:`~gatekeeper.proxy.pipeline.build_handler`),
    identified by ``identifier``.

    Made in a running loop; ``kwargs`` go to aiohttp's ``ServerRunner`` (``shutdown_timeout``).
    """

    def __init__(
        self, identifier: Identifier, limits: Limits = DEFAULT_LIMITS, **kwargs: Any
    ) -> None:
        gatekeeper = identifier.gatekeeper
        self.guard = ConnectionGuard(gatekeeper, limits)
        server = _GuardedServer(
            self.guard,
            identifier,
            build_handler(gatekeeper, identifier.identify),
            keepalive_timeout=limits.keepalive_timeout,
            access_log=log,
            access_log_class=_Answered,
        )
        super().__init__(server, handle_signals=False, **kwargs)
        self.connections = server
        """The server whose connections these are (a protocol factory)."""

    def connection(self, ticket: Ticket) -> asyncio.Protocol:
        """A new connection, already counted by ``ticket`` (a TLS listener's, from accept)."""
        made = self.connections()
        assert isinstance(made, _GuardedHandler)
        made.ticket = ticket
        return made
