"""Requests in flight, counted once: shutdown drains this count, the per-driver budgets admit
against it, and ``/metrics`` exports it (``dra_gatekeeper_requests_in_flight``).

aiohttp's own shutdown stops reading from every connection at once, which would cut a request
body in transit; the server first waits here, with the connections still open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator

__all__ = ["InFlight"]

log = logging.getLogger("gatekeeper.server")


class InFlight:
    """Every request in the pipeline (``total``), and once its driver is known, that driver's
    ``requests`` or ``watches``; :meth:`drain` waits until none is left."""

    def __init__(self) -> None:
        self.total = 0
        """Requests in the pipeline, identified or not."""
        self.requests: Counter[str] = Counter()
        """Requests (not watches) per driver, while admitted
        (:class:`~gatekeeper.proxy.budgets.DriverBudgets`)."""
        self.watches: Counter[str] = Counter()
        """Open watches per driver, while admitted."""
        self._idle = asyncio.Event()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Count one request for the duration (the pipeline's first and last step)."""
        self.total += 1
        try:
            yield
        finally:
            self.total -= 1
            if not self.total:
                self._idle.set()

    def by_driver(self) -> Counter[str]:
        """Requests and watches being served, per driver (the in-flight gauge)."""
        return self.requests + self.watches

    async def drain(self, grace: float, tick: Callable[[], object]) -> int:
        """Wait up to ``grace`` seconds for every request; call ``tick`` while waiting.

        Returns how many were still in flight when the grace period ended (they are cancelled
        by the caller's shutdown).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self.total and loop.time() < deadline:
            tick()
            self._idle.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 0.05)
        if self.total:
            log.warning("grace period over: %d requests cancelled", self.total)
        return self.total
