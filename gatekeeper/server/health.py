"""The health listener: ``/healthz`` (alive), ``/readyz`` (able to serve), ``/metrics``.

Ready means: the policy is loaded, every listener is up, and the upstream answers. The
upstream is asked (``GET /version`` with the node's credentials) at most once per
``ttl`` seconds, so probes of a kubelet or a Prometheus never load the apiserver.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from gatekeeper.errors import UpstreamError
from gatekeeper.server.metrics import CONTENT_TYPE, Metrics
from gatekeeper.upstream.session import Upstream, request

__all__ = ["Probe", "Readiness", "build_health_app", "upstream_probe"]

log = logging.getLogger("gatekeeper.health")

Probe = Callable[[], Awaitable[str | None]]
"""Checks the upstream: None when it answers, else why not."""


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


def build_health_app(readiness: Readiness, metrics: Metrics) -> web.Application:
    """The health listener's application."""
    app = web.Application()

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        problem = await readiness.check()
        metrics.ready.set(0 if problem else 1)
        if problem:
            return web.Response(text=f"not ready: {problem}\n", status=503)
        return web.Response(text="ok")

    async def metrics_text(_: web.Request) -> web.Response:
        response = web.Response(body=metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE
        return response

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_text)
    return app
