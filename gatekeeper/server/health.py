"""The health listener: ``/healthz`` (alive), ``/readyz`` (able to serve), ``/metrics``.

Ready means: the policy is loaded, every listener is up, and the upstream answers. The
upstream is asked (``GET /version`` with the node's credentials) at most once per
``ttl`` seconds, so probes of a kubelet or a Prometheus never load the apiserver.

Anyone who reaches the port can connect, so what it may hold is bounded (docs/operating.md,
"Limits"): at most ``--max-health-connections`` connections, each closed when it has not sent a
complete request within ``--header-timeout`` of being opened or of its last answer, and
``/metrics`` rendered at most a few times a second (:meth:`Metrics.scrape`). The drivers'
descriptors are budgeted apart (:func:`gatekeeper.limits.fit_to_descriptors`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gatekeeper.errors import UpstreamError
from gatekeeper.limits import Limits
from gatekeeper.server.metrics import CONTENT_TYPE, Metrics
from gatekeeper.upstream.session import Upstream, request

__all__ = [
    "HEALTH_PATHS",
    "Handler",
    "HealthServer",
    "Probe",
    "Readiness",
    "health_handler",
    "health_server",
    "upstream_probe",
]

log = logging.getLogger("gatekeeper.health")

HEALTH_PATHS = ("/healthz", "/readyz", "/metrics")
_PROBES = frozenset({"/healthz", "/readyz"})
"""What a kubelet asks: a connection answering one is never closed to make room."""

Probe = Callable[[], Awaitable[str | None]]
"""Checks the upstream: None when it answers, else why not."""

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
"""aiohttp's low-level request handler."""


def upstream_probe(upstream: Upstream) -> Probe:
    """Ask the upstream ``GET /version`` with the node's credentials: None when it answers."""

    async def probe() -> str | None:
        try:
            status, _ = await request(upstream, "GET", "/version")
        except UpstreamError as exc:
            return exc.message
        return None if status == 200 else f"upstream answered GET /version with HTTP {status}"

    return probe


class Readiness:
    """Whether the gatekeeper can serve, with the upstream's answer cached for ``ttl`` seconds."""

    def __init__(
        self,
        probe: Probe,
        listening: Callable[[], bool],
        *,
        ttl: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self._listening = listening
        self._ttl = ttl
        self._clock = clock
        self._checked_at: float | None = None
        self._upstream_problem: str | None = None
        self._first = True
        self._running: asyncio.Task[str | None] | None = None

    async def check(self) -> str | None:
        """None when ready, else the reason (one line, for ``/readyz`` and the log)."""
        if not self._listening():
            return "listeners are not up"
        now = self._clock()
        if self._checked_at is None or now - self._checked_at >= self._ttl:
            if self._running is None:
                self._running = asyncio.ensure_future(self._probe_once())
            running = self._running
            try:
                problem = await asyncio.shield(running)
            finally:
                if self._running is running and running.done():
                    self._running = None
            if problem != self._upstream_problem or (self._first and problem):
                if problem is None:
                    log.info("upstream reachable again")
                else:
                    log.warning("not ready: %s", problem)
            self._upstream_problem, self._first = problem, False
            self._checked_at = self._clock()
        return self._upstream_problem

    async def _probe_once(self) -> str | None:
        try:
            return await self._probe()
        except Exception as exc:  # a probe must never take the health port down
            return f"upstream check failed: {type(exc).__name__}"


def health_handler(readiness: Readiness, metrics: Metrics) -> Handler:
    """The health listener's answers: GET (or HEAD) of :data:`HEALTH_PATHS`, else 404/405."""

    async def readyz() -> web.Response:
        problem = await readiness.check()
        metrics.ready.set(0 if problem else 1)
        if problem:
            return web.Response(text=f"not ready: {problem}\n", status=503)
        return web.Response(text="ok")

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.path not in HEALTH_PATHS:
            return web.Response(text="404: Not Found", status=404)
        if request.method not in ("GET", "HEAD"):
            allow = {"Allow": "GET, HEAD"}
            return web.Response(text="405: Method Not Allowed", status=405, headers=allow)
        if request.path == "/healthz":
            return web.Response(text="ok")
        if request.path == "/readyz":
            return await readyz()
        return web.Response(body=await metrics.scrape(), headers={"Content-Type": CONTENT_TYPE})

    return handle


class HealthServer(web.Server):
    """aiohttp's low-level server with a cap on the connections it holds.

    A connection past ``cap`` closes the oldest one that is not answering a probe (idle between
    requests, its request not arrived yet, or a scrape waiting for its render), or itself when
    every other one is answering a probe: connections held idle or scraping cannot keep a
    kubelet's probe out. A connection whose next request has not arrived (headers complete)
    within ``idle_timeout`` of its start or of its last answer is closed (also aiohttp's
    keep-alive timeout).
    """

    def __init__(self, handler: Handler, *, cap: int, idle_timeout: float) -> None:
        super().__init__(
            self._answer,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=idle_timeout,
        )
        self.cap = cap
        self.closed_over_cap = 0
        """Connections closed to keep the cap."""
        self._handler = handler
        self._idle_timeout = idle_timeout
        self._held: OrderedDict[RequestHandler, asyncio.Transport] = OrderedDict()
        self._probing: set[RequestHandler] = set()
        self._idle: dict[RequestHandler, asyncio.TimerHandle] = {}

    @property
    def held(self) -> int:
        """Connections open now."""
        return len(self._held)

    async def _answer(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = request.protocol
        if (timer := self._idle.pop(connection, None)) is not None:
            timer.cancel()
        if request.path in _PROBES:
            self._probing.add(connection)
        try:
            return await self._handler(request)
        finally:
            self._probing.discard(connection)
            if connection in self._held:
                self._watch_idle(connection)

    def _watch_idle(self, handler: RequestHandler) -> None:
        loop = asyncio.get_running_loop()
        self._idle[handler] = loop.call_later(self._idle_timeout, self._close_idle, handler)

    def _close_idle(self, handler: RequestHandler) -> None:
        self._idle.pop(handler, None)
        if (transport := self._held.pop(handler, None)) is not None:
            transport.close()

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self._held[handler] = transport
        self._watch_idle(handler)
        if len(self._held) > self.cap:
            # The oldest connection not answering a probe; at worst the new one itself.
            victim = next(held for held in self._held if held not in self._probing)
            self._held.pop(victim).close()
            self.closed_over_cap += 1
            if self.closed_over_cap == 1 or self.closed_over_cap % 100 == 0:
                log.warning(
                    "health connection closed over the cap cap=%d closed=%d",
                    self.cap,
                    self.closed_over_cap,
                )

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self._held.pop(handler, None)
        self._probing.discard(handler)
        if (timer := self._idle.pop(handler, None)) is not None:
            timer.cancel()


def health_server(readiness: Readiness, metrics: Metrics, limits: Limits) -> HealthServer:
    """The health listener's server, bounded by ``limits`` (needs a running event loop)."""
    return HealthServer(
        health_handler(readiness, metrics),
        cap=limits.health_connections,
        idle_timeout=min(limits.header_timeout, limits.keepalive_timeout),
    )
