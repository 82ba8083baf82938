"""How many TokenReviews the token listener's callers may cause (DESIGN §4.2; docs/security.md,
"The token listener").

A token whose answer is cached costs no review and is never counted here: only a review about
to be asked is. Each bound is a token bucket holding one second of its rate (at least two):

- callers no driver's token has vouched for: per connection, per source address (an IPv6 /64;
  all of loopback is one address), and for the whole process;
- each driver has a share of its own, so that no flood from elsewhere delays it: for its own
  token asked about again once its cached answer expired, and a new token on a connection
  that last carried the driver's token (a rotated token on a kept-alive connection, still
  within that connection's bucket); and a second share for a new token from an address the
  driver connected from within the hour (a restarted container). Past its share such a
  review takes its turn with everyone's.

Over a bound: 429 with ``Retry-After`` (client-go retries it; a 401 would tell a driver its
token is bad, which nobody has checked). Every refusal on a connection, whatever its reason, is
paced (:meth:`ReviewBudget.pace`): one keep-alive connection cannot have any number of requests
answered. Every key is a driver of the policy, a source address seen within the last seconds
(at most :data:`MAX_SOURCES`), or a connection's own state: the state stays bounded whatever
the callers send.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.listen.identity._failures import TokenFailure, TokenRefusal

__all__ = [
    "KNOWN_FOR",
    "MAX_SOURCES",
    "ReviewBudget",
    "ReviewCaller",
    "Scope",
    "source_key",
]

MAX_SOURCES = 4096
"""Source addresses whose buckets are kept (an address idle for a second has a full bucket
again, so only the last second's are needed)."""
KNOWN_FOR = 3600.0
"""Seconds an address a driver connected from keeps that driver's share."""
_MAX_KNOWN_SOURCES = 1024
_LOOPBACK = "loopback"
_OWN, _ADDRESS = "own", "address"


class Scope(Enum):
    """The bound a review was refused by: its flag, and what it counts."""

    CONNECTION = ("--max-token-reviews-per-connection", "on one connection")
    SOURCE = ("--max-token-reviews-per-source", "from one source address")
    PROCESS = ("--max-token-reviews", "in all for callers no driver's token vouched for")

    @property
    def flag(self) -> str:
        return self.value[0]

    @property
    def counted(self) -> str:
        return self.value[1]


class _Bucket:
    """A token bucket's level at ``stamp`` (its rate and capacity are the budget's)."""

    __slots__ = ("level", "stamp")

    def __init__(self, level: float, stamp: float) -> None:
        self.level = level
        self.stamp = stamp


@dataclass(frozen=True, slots=True)
class _Rate:
    per_second: float

    @property
    def capacity(self) -> float:
        return max(2.0, self.per_second)

    def full(self, now: float) -> _Bucket:
        return _Bucket(self.capacity, now)

    def level(self, bucket: _Bucket, now: float) -> float:
        """The bucket's level now (refilled since its stamp)."""
        gained = (now - bucket.stamp) * self.per_second
        bucket.level, bucket.stamp = min(self.capacity, bucket.level + gained), now
        return bucket.level

    def wait(self, bucket: _Bucket) -> int:
        """Whole seconds until the bucket holds one review again (at least 1)."""
        return max(1, math.ceil((1.0 - bucket.level) / self.per_second))


@dataclass(slots=True)
class ReviewCaller:
    """One connection of the token listener as the budget sees it: its source address's key
    (:func:`source_key`), its buckets (reviews, refusals), and the driver whose token it carried
    last (None until one did, or once it carried a token that is no driver's)."""

    source: str
    driver: str | None = None
    reviews: _Bucket | None = None
    refusals: _Bucket | None = None


def source_key(address: str | None) -> str:
    """The key a peer address is counted under: the IPv4 address, the /64 of an IPv6 address
    (one host's usual share), and one key for all of loopback (a local process can use any of
    127.0.0.0/8)."""
    try:
        ip = ipaddress.ip_address((address or "").split("%", 1)[0])
    except ValueError:
        return "unknown"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return _LOOPBACK
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)


class ReviewBudget:
    """The bounds of the module docstring, from ``limits``: :meth:`admit` takes one review or
    refuses it (429, :class:`TokenRefusal`); :meth:`recognise` and :meth:`distrust` learn from
    each answer."""

    def __init__(
        self, limits: Limits = DEFAULT_LIMITS, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._connection = _Rate(limits.token_reviews_per_connection)
        self._source = _Rate(limits.token_reviews_per_source)
        self._process = _Rate(limits.token_reviews)
        self._driver = _Rate(limits.token_reviews_per_driver)
        self._refusals = _Rate(limits.token_refusals_per_connection)
        now = clock()
        self._everyone = self._process.full(now)
        self._sources: OrderedDict[str, _Bucket] = OrderedDict()
        self._drivers: dict[tuple[str, str], _Bucket] = {}
        """(driver, own or address) -> its share: drivers come from the policy, a bounded set."""
        self._known: OrderedDict[str, tuple[str, float]] = OrderedDict()
        """Source key -> (the driver that connected from it, until when it keeps its share)."""

    @property
    def tracked_sources(self) -> int:
        """Source addresses whose buckets are kept now (at most :data:`MAX_SOURCES`)."""
        return len(self._sources)

    def admit(self, caller: ReviewCaller, known: str | None = None) -> None:
        """Take one review for ``caller``, or raise a 429 :class:`TokenRefusal` naming the bound.

        ``known`` is the driver whose token it is, when the token is one the gatekeeper
        reviewed before and whose answer expired: such a review is bounded by the cache
        already (one per token per TTL) and skips the connection's bucket.
        """
        now = self._clock()
        connection = None
        if known is None:
            connection = self._connection_bucket(caller, now)
            if self._connection.level(connection, now) < 1:
                raise _refusal(Scope.CONNECTION, self._connection, connection)
        share = self._share(caller, known, now)
        if share is not None and self._driver.level(share, now) >= 1:
            taken: tuple[_Bucket | None, ...] = (share, connection)
        else:
            source = self._source_bucket(caller.source, now)
            if self._source.level(source, now) < 1:
                raise _refusal(Scope.SOURCE, self._source, source)
            if self._process.level(self._everyone, now) < 1:
                raise _refusal(Scope.PROCESS, self._process, self._everyone)
            taken = (connection, source, self._everyone)
        for bucket in taken:
            if bucket is not None:
                bucket.level -= 1

    def _share(self, caller: ReviewCaller, known: str | None, now: float) -> _Bucket | None:
        """The driver's bucket a review is charged to first, if any: its own (its token, its
        connection), or the one of the addresses it connected from (which others on the same
        address, a host-network pod, can use up too)."""
        if (driver := known or caller.driver) is not None:
            key = (driver, _OWN)
        elif (driver := self._known_driver(caller.source, now)) is not None:
            key = (driver, _ADDRESS)
        else:
            return None
        bucket = self._drivers.get(key)
        if bucket is None:
            bucket = self._drivers[key] = self._driver.full(now)
        return bucket

    def pace(self, caller: ReviewCaller) -> float:
        """Seconds to hold a refusal on ``caller``'s connection before answering it (0: at
        once): its refusals are answered at ``--max-token-refusals-per-connection`` after a
        burst, one request at a time as HTTP/1.1 serves them."""
        now = self._clock()
        if caller.refusals is None:
            caller.refusals = self._refusals.full(now)
        bucket = caller.refusals
        level = self._refusals.level(bucket, now)
        bucket.level = level - 1  # below 0: owed until the wait is over
        return 0.0 if level >= 1 else (1.0 - level) / self._refusals.per_second

    def recognise(self, caller: ReviewCaller, driver: str) -> None:
        """``caller`` showed ``driver``'s token: its connection and address get that driver's
        share for a new token (a rotation)."""
        if caller.driver == driver:
            return  # known already: nothing to refresh on every request
        caller.driver = driver
        self._known[caller.source] = (driver, self._clock() + KNOWN_FOR)
        self._known.move_to_end(caller.source)
        while len(self._known) > _MAX_KNOWN_SOURCES:
            self._known.popitem(last=False)

    def distrust(self, caller: ReviewCaller) -> None:
        """``caller``'s connection showed a token that is no driver's: it loses the share."""
        caller.driver = None

    def _connection_bucket(self, caller: ReviewCaller, now: float) -> _Bucket:
        if caller.reviews is None:
            caller.reviews = self._connection.full(now)
        return caller.reviews

    def _source_bucket(self, source: str, now: float) -> _Bucket:
        sources = self._sources
        # Buckets idle long enough to be full again are dropped: only recent sources are kept.
        refill = self._source.capacity / self._source.per_second
        while sources:
            oldest = next(iter(sources.values()))
            if now - oldest.stamp < refill and len(sources) < MAX_SOURCES:
                break
            sources.popitem(last=False)
        bucket = sources.pop(source, None) or self._source.full(now)
        sources[source] = bucket
        return bucket

    def _known_driver(self, source: str, now: float) -> str | None:
        known = self._known.get(source)
        if known is None:
            return None
        if now >= known[1]:
            del self._known[source]
            return None
        return known[0]


def _refusal(scope: Scope, rate: _Rate, bucket: _Bucket) -> TokenRefusal:
    wait = rate.wait(bucket)
    return TokenRefusal(
        TokenFailure.RATE_LIMITED,
        429,
        f"token reviews rate limited {scope.counted} ({scope.flag})",
        f"Too many requests: the gatekeeper asks the apiserver about at most "
        f"{rate.per_second:g} new tokens per second {scope.counted} ({scope.flag}); retry "
        f"after {wait} s",
        retry_after=wait,
    )
