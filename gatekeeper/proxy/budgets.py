"""Per-driver budgets: what one driver may hold at once, so no driver can starve another
(docs/operating.md#limits). Over budget is a 429 Refusal with Retry-After.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from gatekeeper.errors import Refusal
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.proxy.inflight import InFlight

__all__ = ["DriverBudgets"]

_RETRY_AFTER = 1


class DriverBudgets:
    """In-flight requests, open watches and filtered reads per driver; a request over budget
    is refused (a filtered read waits its turn first)."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, in_flight: InFlight | None = None) -> None:
        self.limits = limits
        self.in_flight = in_flight if in_flight is not None else InFlight()
        """The one count of requests in flight: budgets admit against its per-driver counts."""
        self.inflight = self.in_flight.requests
        self.watches = self.in_flight.watches
        self.refused: Counter[str] = Counter()
        """Requests refused as over budget, per driver (exported by the metrics endpoint)."""
        self._filtered: dict[str, _Turns] = {}

    def filtered_reads(self, driver: str) -> int:
        """``driver``'s filtered reads now, holding a turn or waiting for one."""
        turns = self._filtered.get(driver)
        return 0 if turns is None else turns.users

    @asynccontextmanager
    async def filtered_read(self, driver: str) -> AsyncIterator[None]:
        """Hold one of ``driver``'s filtered-read turns for the duration
        (docs/operating.md#filtered-reads); wait for one up to ``upstream_wait``, then
        Refusal(429). Drivers never wait for each other's turns."""
        turns = self._filtered.get(driver)
        if turns is None:
            turns = self._filtered[driver] = _Turns(self.limits.filtered_reads_per_driver)
        turns.users += 1
        try:
            try:
                async with asyncio.timeout(self.limits.upstream_wait):
                    await turns.free.acquire()
            except TimeoutError:
                self.refused[driver] += 1
                limit = self.limits.filtered_reads_per_driver
                raise Refusal(
                    429,
                    f"driver has {limit} filtered reads in progress, its budget",
                    f'too many requests: driver "{driver}" waited '
                    f"{self.limits.upstream_wait:g} seconds behind its own {limit} filtered "
                    f"lists or watch primes; retry later",
                    retry_after=_RETRY_AFTER,
                ) from None
            try:
                yield
            finally:
                turns.free.release()
        finally:
            turns.users -= 1
            if turns.users == 0:
                del self._filtered[driver]  # bounded by the drivers reading now

    @contextmanager
    def admit(self, driver: str, *, watch: bool) -> Iterator[None]:
        """Hold one unit of ``driver``'s budget for the duration; Refusal(429) if none is left."""
        counts = self.watches if watch else self.inflight
        limit = self.limits.watches_per_driver if watch else self.limits.inflight_per_driver
        if counts[driver] >= limit:
            self.refused[driver] += 1
            what = "open watches" if watch else "requests in flight"
            raise Refusal(
                429,
                f"driver has {limit} {what}, its budget",
                f'too many requests: driver "{driver}" has {counts[driver]} {what}, the most '
                f"the gatekeeper allows one driver; retry later",
                retry_after=_RETRY_AFTER,
            )
        counts[driver] += 1
        try:
            yield
        finally:
            counts[driver] -= 1
            if counts[driver] <= 0:
                del counts[driver]


class _Turns:
    """One driver's filtered-read turns, and how many requests hold or wait for one."""

    __slots__ = ("free", "users")

    def __init__(self, size: int) -> None:
        self.free = asyncio.Semaphore(size)
        self.users = 0
