"""Per-driver isolation: what one driver may hold at once, so no driver can starve another
(README, "Limits"). Budgets are counted here; over budget is a 429 Refusal with Retry-After.

Connections are capped in :mod:`gatekeeper.connections`; the upstream pools in
:mod:`gatekeeper.upstream`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace

from gatekeeper.errors import ConfigError, Refusal

__all__ = [
    "DEFAULT_LIMITS",
    "DriverBudgets",
    "Limits",
    "add_limit_arguments",
    "fit_to_descriptors",
    "limits_from_flags",
]

log = logging.getLogger("gatekeeper.limits")

_RETRY_AFTER = 1
_RESERVED_DESCRIPTORS = 64
"""Descriptors kept for listeners, the audit log, policy reads and the gatekeeper's own pool."""
_LISTENER_KINDS = 2
"""Unix sockets and mTLS: each has its own caps."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Every bound that keeps one driver from hurting another (all configurable)."""

    inflight_per_driver: int = 32
    """Requests (not watches) of one driver being served at once; more: 429."""
    watches_per_driver: int = 64
    """Open watches of one driver; more: 429."""
    filtered_reads_per_driver: int = 4
    """Filtered lists and watch primes of one driver read at once; more wait their turn (up
    to ``upstream_wait``, then 429), so the memory and the event loop's time they take do
    not grow with the driver's concurrency."""
    connections_per_driver: int = 128
    """Open connections from one driver (socket directory or certificate CN), per listener
    kind."""
    connections_total: int = 1024
    """Open connections from all drivers, per listener kind (Unix sockets, mTLS): a listener
    never takes another's capacity."""
    connections_unauthenticated: int = 256
    """Open connections that are no driver's (yet), per listener kind: TLS handshakes in
    progress, certificates that name no driver. They never take a driver's capacity; when
    they are this many, the oldest is closed for a new one."""
    header_timeout: float = 10.0
    """Seconds from a request's first byte to the end of its headers; then the connection is
    closed (slowloris)."""
    body_timeout: float = 30.0
    """Seconds to read a request body; then 408."""
    keepalive_timeout: float = 60.0
    """Seconds an idle keep-alive connection stays open."""
    upstream_wait: float = 5.0
    """Seconds a request may wait for a free upstream connection; then 503 + Retry-After."""
    upstream_requests: int = 64
    """Upstream connections for drivers' requests (watches have their own)."""
    upstream_watches: int = 1024
    """Upstream connections for drivers' watches."""
    upstream_own: int = 16
    """Upstream connections reserved for the gatekeeper's own reads (fetch, dry run)."""
    upstream_connect_timeout: float = 10.0
    """Seconds to connect to the upstream; then 504."""
    upstream_timeout: float = 60.0
    """Seconds without a byte of an upstream answer (not a watch); then 504."""

    def check(self) -> Limits:
        """This value, or ConfigError naming the first bound that is not positive."""
        for name in self.__dataclass_fields__:
            if getattr(self, name) <= 0:
                raise ConfigError(f"limit {name} must be positive, not {getattr(self, name)}")
        return self


DEFAULT_LIMITS = Limits()

# flag -> (Limits field, help); defaults come from Limits.
_FLAGS = {
    "--max-requests-per-driver": ("inflight_per_driver", "requests of one driver served at once"),
    "--max-watches-per-driver": ("watches_per_driver", "open watches of one driver"),
    "--max-filtered-reads-per-driver": (
        "filtered_reads_per_driver",
        "filtered lists and watch primes of one driver read at once",
    ),
    "--max-connections-per-driver": ("connections_per_driver", "connections of one driver"),
    "--max-connections": ("connections_total", "connections of all drivers, per listener kind"),
    "--max-unauthenticated-connections": (
        "connections_unauthenticated",
        "connections that are no driver's yet (TLS handshakes), per listener kind",
    ),
    "--header-timeout": ("header_timeout", "seconds to receive a request's headers"),
    "--body-timeout": ("body_timeout", "seconds to receive a request body (then 408)"),
    "--keepalive-timeout": ("keepalive_timeout", "seconds an idle connection stays open"),
    "--upstream-wait": ("upstream_wait", "seconds to wait for an upstream connection (then 503)"),
    "--upstream-connections": ("upstream_requests", "upstream connections for requests"),
    "--upstream-watch-connections": ("upstream_watches", "upstream connections for watches"),
    "--upstream-connect-timeout": ("upstream_connect_timeout", "seconds to connect upstream"),
    "--upstream-timeout": ("upstream_timeout", "seconds an upstream answer may stall (504)"),
}


def add_limit_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The ``serve`` flags for every limit (README, "Limits")."""
    for flag, (name, what) in _FLAGS.items():
        default = getattr(DEFAULT_LIMITS, name)
        parser.add_argument(
            flag, type=type(default), default=default,
            metavar="SECONDS" if what.startswith("seconds") else "N",
            help=f"{what} (default {default:g})",
        )  # fmt: skip


def limits_from_flags(namespace: argparse.Namespace) -> Limits:
    """The Limits the ``serve`` flags ask for (checked; not yet fitted to descriptors)."""
    values = {name: getattr(namespace, flag[2:].replace("-", "_")) for flag, (name, _) in
              _FLAGS.items()}  # fmt: skip
    return replace(DEFAULT_LIMITS, **values).check()


def fit_to_descriptors(limits: Limits, soft_limit: int | None = None) -> Limits:
    """``limits`` with connection caps lowered so the descriptor limit is never hit first.

    Every connection a cap admits is a descriptor: the drivers' (two listener kinds, each up
    to ``connections_total``), the unauthenticated buckets, and the upstream pools. The soft
    ``RLIMIT_NOFILE`` is raised to the hard one first, as Go programs do.
    """
    if soft_limit is None:
        soft_limit = _raise_nofile()
    fixed = _RESERVED_DESCRIPTORS + limits.upstream_own
    fixed += _LISTENER_KINDS * limits.connections_unauthenticated
    upstream = limits.upstream_requests + limits.upstream_watches
    if fixed + _LISTENER_KINDS * limits.connections_total + upstream <= soft_limit:
        return limits
    # Half for the drivers' connections, half for the upstream connections they may hold.
    budget = max(16, (soft_limit - fixed) // 2)
    fitted = limits
    if _LISTENER_KINDS * limits.connections_total > budget:
        fitted = replace(fitted, connections_total=max(8, budget // _LISTENER_KINDS))
    if upstream > budget:
        share = max(4, budget // 4)
        fitted = replace(fitted, upstream_requests=share, upstream_watches=budget - share)
    if fitted is not limits:
        log.warning(
            "connection limits lowered to fit %d descriptors: connections_total=%d "
            "upstream_requests=%d upstream_watches=%d",
            soft_limit,
            fitted.connections_total,
            fitted.upstream_requests,
            fitted.upstream_watches,
        )
    return fitted


def _raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


class DriverBudgets:
    """In-flight requests, open watches and filtered reads per driver; a request over budget
    is refused (a filtered read waits its turn first)."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.inflight: Counter[str] = Counter()
        self.watches: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        """Requests refused as over budget, per driver (exported by the metrics endpoint)."""
        self._filtered: dict[str, _Turns] = {}

    def filtered_reads(self, driver: str) -> int:
        """``driver``'s filtered reads now, holding a turn or waiting for one."""
        turns = self._filtered.get(driver)
        return 0 if turns is None else turns.users

    @asynccontextmanager
    async def filtered_read(self, driver: str) -> AsyncIterator[None]:
        """Hold one of ``driver``'s filtered-read turns for the duration (README, "Filtered
        reads"); wait for one up to ``upstream_wait``, then Refusal(429). Drivers never wait
        for each other's turns."""
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
