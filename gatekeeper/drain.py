"""Requests in flight, counted so that shutdown can wait for them (DESIGN §4.1, issue 12).

aiohttp's own shutdown stops reading from every connection at once, which would cut a request
body in transit; the server first waits here, with the connections still open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

__all__ = ["InFlight"]

log = logging.getLogger("gatekeeper.server")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class InFlight:
    """Counts requests in their handler; :meth:`drain` waits until none is left."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        self.count += 1
        try:
            return await handler(request)
        finally:
            self.count -= 1
            if not self.count:
                self._idle.set()

    async def drain(self, grace: float, tick: Callable[[], object]) -> int:
        """Wait up to ``grace`` seconds for every request; call ``tick`` while waiting.

        Returns how many were still in flight when the grace period ended (they are cancelled
        by the caller's shutdown).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.count and loop.time() < deadline:
            tick()
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 0.05)
        if self.count:
            log.warning("grace period over: %d requests cancelled", self.count)
        return self.count
