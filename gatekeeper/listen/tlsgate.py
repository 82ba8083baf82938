"""The mTLS listener's handshakes, run by the gatekeeper itself so that every connection is
counted from the moment it is accepted (README, "Limits").

With aiohttp's own site, asyncio runs the handshake before aiohttp sees the connection: a
connection is invisible to the connection caps until its handshake ends, and one that never
sends a ClientHello holds a descriptor for asyncio's 60 s. Here each accepted connection gets a
gate protocol that counts it in its listener kind's bucket of unauthenticated connections
(:meth:`~gatekeeper.listen.capacity.ConnectionGuard.admit_unauthenticated`: the oldest is
closed when the bucket is full), runs the handshake (``loop.start_tls``, within
``--header-timeout``), reports one that fails
(:meth:`~gatekeeper.listen.tls.ServerTLS.handshake_failed`), and hands the TLS connection with
its count to aiohttp's connection, which moves it to its driver once the certificate the
handshake verified names one.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import weakref
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gatekeeper.listen.capacity import ConnectionGuard, Ticket
from gatekeeper.listenerkind import ListenerKind

__all__ = ["TLSGateSite"]

log = logging.getLogger("gatekeeper.tlsgate")

_TIMEOUT_REASON = "HANDSHAKE_TIMEOUT"


class TLSGateSite(web.SockSite):
    """A ``SockSite`` whose TLS handshakes the :class:`_Gate` runs (see the module docstring).

    ``listener`` names the listener kind whose unauthenticated bucket holds the connections
    until they are a driver's (:attr:`~ListenerKind.MTLS`, or the token listener's own).
    """

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: Any,
        tls: ssl.SSLContext,
        guard: ConnectionGuard,
        *,
        listener: ListenerKind = ListenerKind.MTLS,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, sock, ssl_context=tls, backlog=backlog)
        self._tls = tls
        self._guard = guard
        self._listener = listener
        self._gates: weakref.WeakSet[_Gate] = weakref.WeakSet()

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            lambda: self._gate(server), sock=self._sock, backlog=self._backlog
        )

    async def stop(self) -> None:
        await super().stop()
        for gate in list(self._gates):
            gate.abort()  # handshakes still running: nothing of them is served

    def _gate(self, factory: Callable[[], RequestHandler]) -> _Gate:
        gate = _Gate(factory, self._tls, self._guard, self._listener)
        self._gates.add(gate)
        return gate


class _Gate(asyncio.Protocol):
    """One accepted connection until its handshake ends: counted, handshaken, handed over."""

    def __init__(
        self,
        factory: Callable[[], RequestHandler],
        tls: ssl.SSLContext,
        guard: ConnectionGuard,
        listener: ListenerKind,
    ) -> None:
        self._factory = factory
        self._tls = tls
        self._guard = guard
        self._listener = listener
        self._transport: asyncio.Transport | None = None
        self._ticket: Ticket | None = None
        self._task: asyncio.Task[None] | None = None
        self._early: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport: the same methods, though.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        transport.pause_reading()  # the ClientHello is start_tls's to read (asyncio)
        self._ticket = self._guard.admit_unauthenticated(self._listener, transport.close)
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._handshake(transport))
        # Runs right after the task's first step, in which start_tls puts its TLS protocol in
        # place and queues that protocol's connection_made and the transport's resume_reading.
        loop.call_soon(self._after_start_tls)

    def data_received(self, data: bytes) -> None:
        # uvloop starts reading as soon as connection_made returns (a pause there is too
        # early to hold): what a client sends at once (its ClientHello) arrives here, before
        # start_tls takes the connection over. Kept, and no more read until it has.
        self._early.append(data)
        if self._transport is not None:
            self._transport.pause_reading()

    def _after_start_tls(self) -> None:
        if self._early and self._transport is not None and not self._transport.is_closing():
            # Queued behind start_tls's own two callbacks: the TLS protocol gets the early
            # bytes after its connection_made, before anything more is read from the client.
            asyncio.get_running_loop().call_soon(self._hand_early_bytes)

    def _hand_early_bytes(self) -> None:
        assert self._transport is not None
        protocol = self._transport.get_protocol()
        data = b"".join(self._early)
        self._early.clear()
        if protocol is self or self._transport.is_closing():
            return
        if isinstance(protocol, asyncio.BufferedProtocol) or hasattr(protocol, "get_buffer"):
            buffered = cast(asyncio.BufferedProtocol, protocol)
            while data:
                buffer = memoryview(buffered.get_buffer(len(data)))
                size = min(len(buffer), len(data))
                buffer[:size] = data[:size]
                buffered.buffer_updated(size)
                data = data[size:]
        else:
            cast(asyncio.Protocol, protocol).data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        # Before start_tls took the connection over (it is this protocol's until then).
        if self._ticket is not None:
            self._guard.release(self._ticket)

    def abort(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._transport is not None:
            self._transport.close()

    async def _handshake(self, transport: asyncio.Transport) -> None:
        ticket = self._ticket
        assert ticket is not None
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
        handover = _Handover()
        loop = asyncio.get_running_loop()
        try:
            secured = await loop.start_tls(
                transport,
                handover,
                self._tls,
                server_side=True,
                ssl_handshake_timeout=self._guard.limits.header_timeout,
            )
        except (OSError, TimeoutError, asyncio.CancelledError) as exc:
            made_room = not ticket.counted  # closed as the bucket's oldest: not a failure
            self._guard.release(ticket)
            transport.close()
            if (reason := _failure(exc)) and not made_room:
                self._report(address, reason)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if secured is None or not ticket.counted:
            # Closed meanwhile (the bucket's oldest, made room for a newer one).
            if secured is not None:
                secured.close()
            return
        handover.hand_to(self._factory(), secured, ticket)

    def _report(self, address: str, reason: str) -> None:
        failed = getattr(self._tls, "handshake_failed", None)
        if failed is not None:
            failed(address, reason)
        else:
            log.warning("tls handshake failed peer=%s reason=%s", address, reason)


class _Handover(asyncio.Protocol):
    """The TLS connection's protocol from the end of the handshake until aiohttp's connection
    takes it: both loops deliver what the client sent at once, before ``start_tls`` returns,
    and aiohttp's connection must see ``connection_made`` first."""

    def __init__(self) -> None:
        self._data: list[bytes] = []
        self._eof = False
        self._lost: tuple[BaseException | None] | None = None

    def data_received(self, data: bytes) -> None:
        self._data.append(data)

    def eof_received(self) -> bool | None:
        self._eof = True
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = (exc,)

    def hand_to(self, handler: RequestHandler, secured: asyncio.Transport, ticket: Ticket) -> None:
        """Make ``handler`` the connection's protocol, counted by ``ticket``, and give it what
        arrived meanwhile, in order."""
        secured.set_protocol(handler)
        handler.ticket = ticket  # type: ignore[attr-defined]
        handler.connection_made(secured)
        for data in self._data:
            handler.data_received(data)
        if self._eof:
            handler.eof_received()
        if self._lost is not None:
            handler.connection_lost(self._lost[0])


def _failure(exc: BaseException) -> str:
    """What a failed handshake is reported as; empty for a connection simply gone (reset,
    closed to make room, the server stopping)."""
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or type(exc).__name__)
    if isinstance(exc, TimeoutError) or (
        isinstance(exc, ConnectionAbortedError) and "handshake is taking longer" in str(exc)
    ):
        return _TIMEOUT_REASON
    return ""
