"""The TLS listeners' accept loop, so that every connection is counted from the moment it is
accepted (docs/operating.md#limits).

With aiohttp's own site, asyncio runs the handshake before aiohttp sees the connection: a
connection is invisible to the connection caps until its handshake ends, and one that never
sends a ClientHello holds a descriptor for asyncio's 60 s. Here the site accepts each
connection itself and counts it in its listener kind's bucket of unauthenticated connections
(:meth:`~gatekeeper.listen.capacity.ConnectionGuard.admit_unauthenticated`: the oldest is
closed, its handshake cancelled, when the bucket is full); the loop runs the handshake
(``loop.connect_accepted_socket``, within ``--header-timeout``) into aiohttp's connection, which
holds the count and moves it to its driver once the certificate the handshake verified names
one. A handshake that fails is reported
(:meth:`~gatekeeper.listen.tls.ServerTLS.handshake_failed`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl

from aiohttp import web
from yarl import URL

from gatekeeper.listen.connections import GuardedRunner
from gatekeeper.listen.tls import ListenerTLS
from gatekeeper.listenerkind import ListenerKind

__all__ = ["TLSGateSite"]

log = logging.getLogger("gatekeeper.tlsgate")

_TIMEOUT_REASON = "HANDSHAKE_TIMEOUT"
_ACCEPT_RETRY_SECONDS = 1.0
"""How long accepting pauses when the process is out of descriptors (as asyncio's servers do):
the connections waiting in the backlog stay there meanwhile."""
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class TLSGateSite(web.BaseSite):
    """A site on the listening socket ``sock`` whose connections are counted from accept and
    handshaken with ``tls`` (see the module docstring); the runner stops it with the others.

    ``listener`` names the listener kind whose unauthenticated bucket holds the connections
    until they are a driver's (:attr:`~ListenerKind.MTLS`, or the token listener's own).
    """

    def __init__(
        self,
        runner: GuardedRunner,
        sock: socket.socket,
        tls: ListenerTLS,
        *,
        listener: ListenerKind = ListenerKind.MTLS,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._connections = runner
        self._listening = sock
        self._tls = tls
        self._kind = listener
        self._queue = backlog
        host, port = sock.getsockname()[:2]
        self._url = str(URL.build(scheme="https", host=host, port=port))
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return self._url

    async def start(self) -> None:
        await super().start()  # registers the site with its runner, which stops it at cleanup
        self._listening.setblocking(False)
        self._listening.listen(self._queue)
        self._accepting = asyncio.get_running_loop().create_task(self._accept())

    async def stop(self) -> None:
        """Stop accepting, close the listening socket and every handshake still running
        (nothing of them is served); established connections are the runner's."""
        tasks = [task for task in (self._accepting, *self._handshakes) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._listening.close()
        await super().stop()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._listening)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue  # gone before it was accepted
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise
                log.error(
                    "not accepting connections for %ss listener=%s reason=%s",
                    _ACCEPT_RETRY_SECONDS,
                    self._kind,
                    exc.strerror or exc,
                )
                await asyncio.sleep(_ACCEPT_RETRY_SECONDS)
                continue
            task = loop.create_task(self._handshake(conn))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket) -> None:
        """Count ``conn``, run its handshake into aiohttp's connection, report a failure."""
        task = asyncio.current_task()
        assert task is not None
        guard = self._connections.guard
        # Closing it to make room cancels the handshake; once the handshake is done the
        # connection takes the ticket and closes its transport instead.
        ticket = guard.admit_unauthenticated(self._kind, lambda: _cancel(task))
        address = _address(conn)
        connection = self._connections.connection(ticket)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(guard.limits.header_timeout):
                await loop.connect_accepted_socket(lambda: connection, conn, ssl=self._tls.context)
        except (OSError, TimeoutError, asyncio.CancelledError) as exc:
            # The loop closed the half-made TLS transport; the socket may not have one yet.
            conn.close()
            made_room = not ticket.counted  # closed as the bucket's oldest: not a failure
            guard.release(ticket)
            if (reason := _failure(exc)) and not made_room:
                self._tls.handshake_failed(address, reason)


def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()


def _address(conn: socket.socket) -> str:
    try:
        peer = conn.getpeername()
    except OSError:
        return "unknown"
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"


def _failure(exc: BaseException) -> str:
    """What a failed handshake is reported as; empty for a connection simply gone (reset,
    closed to make room, the server stopping)."""
    if isinstance(exc, ssl.SSLError):
        return str(exc.reason or type(exc).__name__)
    if isinstance(exc, TimeoutError):
        return _TIMEOUT_REASON
    return ""
