"""Per-driver budgets: what one driver may hold at once, so no driver can starve another
(docs/operating.md#limits). Over budget is a 429 Refusal with Retry-After.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from gatekeeper.errors import Refusal
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.proxy.inflight import InFlight
from gatekeeper.request.body import MAX_BODY_BYTES

__all__ = ["BODY_BURST_SECONDS", "DriverBudgets"]

_RETRY_AFTER = 1
BODY_BURST_SECONDS = 8
"""A driver's body budget holds this many seconds of its rate (and at least the largest body):
a driver publishing its slices at start sends them at once."""


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
        self._bodies: dict[str, _BodyBudget] = {}

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
                limit = self.limits.filtered_reads_per_driver
                raise self._over(
                    driver,
                    f"driver has {limit} filtered reads in progress, its budget",
                    f'too many requests: driver "{driver}" waited '
                    f"{self.limits.upstream_wait:g} seconds behind its own {limit} filtered "
                    f"lists or watch primes; retry later",
                ) from None
            try:
                yield
            finally:
                turns.free.release()
        finally:
            turns.users -= 1
            if turns.users == 0:
                del self._filtered[driver]  # bounded by the drivers reading now

    async def body(self, driver: str, size: int) -> None:
        """Take ``size`` bytes of ``driver``'s body budget (``Limits.body_kib_per_driver``),
        waiting in turn with its other bodies until the budget holds them, up to
        ``upstream_wait``; then Refusal(429). Drivers never wait for each other's bodies."""
        budget = self._body_budget(driver)
        budget.users += 1
        try:
            async with asyncio.timeout(self.limits.upstream_wait):
                await budget.take(size)
        except TimeoutError:
            rate = self.limits.body_kib_per_driver
            raise self._over(
                driver,
                f"driver sent {rate} KiB of request bodies a second, its budget",
                f'too many requests: driver "{driver}" sends request bodies faster than the '
                f"{rate} KiB a second the gatekeeper allows one driver (after a burst); "
                f"this {size}-byte body waited {self.limits.upstream_wait:g} seconds for its "
                "turn; retry later",
            ) from None
        finally:
            budget.users -= 1
            if budget.users == 0 and budget.full():
                del self._bodies[driver]  # a full budget is what a new one is

    def charge(self, driver: str, size: int) -> None:
        """Count ``size`` bytes read without a declared length (a chunked body) against
        ``driver``'s body budget: its next bodies wait for them."""
        self._body_budget(driver).charge(size)

    def _over(self, driver: str, reason: str, message: str) -> Refusal:
        """The 429 of ``driver`` over one of its budgets, counted (the metrics endpoint)."""
        self.refused[driver] += 1
        return Refusal(429, reason, message, retry_after=_RETRY_AFTER)

    def _body_budget(self, driver: str) -> _BodyBudget:
        budget = self._bodies.get(driver)
        if budget is None:
            budget = self._bodies[driver] = _BodyBudget(self.limits.body_kib_per_driver * 1024)
        return budget

    @contextmanager
    def admit(self, driver: str, *, watch: bool) -> Iterator[None]:
        """Hold one unit of ``driver``'s budget for the duration; Refusal(429) if none is left."""
        counts = self.watches if watch else self.inflight
        limit = self.limits.watches_per_driver if watch else self.limits.inflight_per_driver
        if counts[driver] >= limit:
            what = "open watches" if watch else "requests in flight"
            raise self._over(
                driver,
                f"driver has {limit} {what}, its budget",
                f'too many requests: driver "{driver}" has {counts[driver]} {what}, the most '
                f"the gatekeeper allows one driver; retry later",
            )
        counts[driver] += 1
        try:
            yield
        finally:
            counts[driver] -= 1
            if counts[driver] <= 0:
                del counts[driver]


class _BodyBudget:
    """One driver's request-body bytes: a token bucket, its waiters served in turn."""

    __slots__ = ("capacity", "level", "rate", "stamp", "turn", "users")

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(float(MAX_BODY_BYTES), rate * BODY_BURST_SECONDS)
        self.level, self.stamp = self.capacity, time.monotonic()
        self.turn = asyncio.Lock()
        self.users = 0

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def full(self) -> bool:
        self._refill()
        return self.level >= self.capacity

    def charge(self, size: int) -> None:
        self._refill()
        self.level -= size

    async def take(self, size: int) -> None:
        async with self.turn:  # FIFO: a large body is not passed over by small ones forever
            self._refill()
            need = min(float(size), self.capacity)
            while self.level < need:
                await asyncio.sleep((need - self.level) / self.rate)
                self._refill()
            self.level -= size


class _Turns:
    """One driver's filtered-read turns, and how many requests hold or wait for one."""

    __slots__ = ("free", "users")

    def __init__(self, size: int) -> None:
        self.free = asyncio.Semaphore(size)
        self.users = 0
