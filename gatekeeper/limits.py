"""Every bound that keeps one driver from hurting another (docs/operating.md, "Limits"): the
values and their fit to the descriptor limit (their ``serve`` flags:
:mod:`gatekeeper.server.flags`).

A leaf value read by every stage: the per-driver budgets are counted in
:mod:`gatekeeper.proxy.budgets`, connections capped in :mod:`gatekeeper.listen.connections`, the
upstream pools sized in :mod:`gatekeeper.upstream.session`.
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Collection
from dataclasses import asdict, dataclass, replace

from gatekeeper.errors import ConfigError
from gatekeeper.listenerkind import ListenerKind

__all__ = [
    "DEFAULT_LIMITS",
    "Limits",
    "descriptor_budget",
    "fit_to_descriptors",
]

log = logging.getLogger("gatekeeper.limits")

_RESERVED_DESCRIPTORS = 64
"""Descriptors kept for the listening sockets, the audit log, policy and certificate reads."""


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
    connections_unauthenticated: int = 1024
    """Open connections that are no driver's (yet), per listener kind: TLS handshakes in
    progress, certificates that name no driver. They never take a driver's capacity; when
    they are this many, the oldest is closed for a new one. As many as ``connections_total``:
    after a restart every driver's connection comes back at once, and each is in this bucket
    until its handshake is done (docs/operating.md#connection-storms)."""
    health_connections: int = 64
    """Open connections to the health listener (anyone who reaches it may connect); when they
    are this many, the oldest one not answering a probe is closed for a new one."""
    header_timeout: float = 10.0
    """Seconds from a request's first byte to the end of its headers; then the connection is
    closed (slowloris)."""
    body_timeout: float = 30.0
    """Seconds to read a request body; then 408."""
    body_kib_per_driver: int = 1024
    """Request-body KiB per second one driver may send, after a burst of
    ``BODY_BURST_SECONDS`` times as many (at least the largest body, 3 MiB): a body past it
    waits, in turn with the driver's others, until the driver's budget holds it (up to
    ``upstream_wait``; then 429). Reading, parsing and forwarding bodies is the event loop's
    work that grows with what a driver sends; this keeps one driver's share of it small, whatever
    it sends (docs/operating.md#limits). A driver's legitimate writes, a few KB each, never
    come near it."""
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
    upstream_reviews: int = 4
    """Upstream connections for TokenReviews (the token listener): reviews never make drivers'
    requests or the gatekeeper's own reads wait, nor the reverse."""
    upstream_connect_timeout: float = 10.0
    """Seconds to connect to the upstream; then 504."""
    upstream_timeout: float = 60.0
    """Seconds without a byte of an upstream answer (not a watch); then 504."""

    token_reviews: float = 20.0
    """TokenReviews per second, the whole process, for callers of the token listener the
    gatekeeper does not know yet (a token, connection and address no driver has shown); more:
    429. A valid token's cached answer costs no review and is never limited."""
    token_reviews_per_source: float = 2.0
    """TokenReviews per second for such callers from one source address (an IPv6 /64; all of
    loopback is one)."""
    token_reviews_per_connection: float = 1.0
    """TokenReviews per second on one connection of the token listener."""
    token_refusals_per_connection: float = 1.0
    """Answers per second to refused requests on one connection of the token listener (no
    token, a token of no driver, over the review budget), after a burst of two: later ones are
    held until their turn, so that one keep-alive connection cannot have any number of
    requests answered."""
    token_reviews_per_driver: float = 4.0
    """TokenReviews per second kept for each driver apart from the rest: its own tokens asked
    about again once their cached answer expired, a new token on a connection that carried
    its token, or from an address it connected from within the hour (a rotated token). Past it
    such a review takes its turn with everyone's."""

    def check(self) -> Limits:
        """This value, or ConfigError naming the first bound that is not positive."""
        for name, value in asdict(self).items():
            if value <= 0:
                raise ConfigError(f"limit {name} must be positive, not {value}")
        return self


DEFAULT_LIMITS = Limits()


def descriptor_budget(limits: Limits, listeners: Collection[ListenerKind]) -> int:
    """The descriptors the gatekeeper may hold at once under ``limits`` with ``listeners``.

    A reserve (listening sockets, the audit log, file reads), the upstream pools, and each
    listener kind configured with its own caps: a drivers' listener up to ``connections_total``
    drivers' connections and its unauthenticated bucket; the token listener also its
    TokenReviews' upstream pool; the health listener its ``health_connections`` and as many
    again (its listen backlog, accepted at once before the cap can close any).
    """
    kinds = set(listeners)
    drivers = sum(1 for kind in kinds if kind.serves_drivers) * _per_drivers_listener(limits)
    upstream = limits.upstream_requests + limits.upstream_watches
    return _set_apart(limits, kinds) + drivers + upstream


def _per_drivers_listener(limits: Limits) -> int:
    """A drivers' listener's connections (the part fitting may lower)."""
    return limits.connections_total + limits.connections_unauthenticated


def _set_apart(limits: Limits, kinds: set[ListenerKind]) -> int:
    """The descriptors fitting leaves as they are: the reserve, the gatekeeper's own upstream
    pool, the TokenReviews' pool (with the token listener), the health listener's."""
    fixed = _RESERVED_DESCRIPTORS + limits.upstream_own
    if ListenerKind.TOKEN in kinds:
        fixed += limits.upstream_reviews
    if ListenerKind.HEALTH in kinds:
        fixed += 2 * limits.health_connections
    return fixed


def fit_to_descriptors(
    limits: Limits, listeners: Collection[ListenerKind], soft_limit: int | None = None
) -> Limits:
    """``limits`` with the drivers' connection caps and the upstream pools lowered so that the
    descriptor limit is never hit first: their :func:`descriptor_budget` fits ``soft_limit``.

    ``soft_limit`` defaults to the soft ``RLIMIT_NOFILE``, raised to the hard one first, as Go
    programs do. The reserve, the gatekeeper's own upstream pools and the health listener (an
    eighth of the limit at most) are set apart first, so the health listener never takes a
    descriptor a driver's connection needs. What is left goes to the drivers' listeners (each
    kind configured alike, a quarter of its share at most to its unauthenticated bucket) and to
    the upstream pools: half each, and either gets what the other does not need.
    """
    if soft_limit is None:
        soft_limit = _raise_nofile()
    kinds = set(listeners)
    if descriptor_budget(limits, kinds) <= soft_limit:
        return limits
    fitted = limits
    if ListenerKind.HEALTH in kinds and 2 * limits.health_connections > soft_limit // 8:
        fitted = replace(fitted, health_connections=max(4, soft_limit // 16))
    drivers = [kind for kind in kinds if kind.serves_drivers]
    available = max(32, soft_limit - _set_apart(fitted, kinds))
    drivers_need = len(drivers) * _per_drivers_listener(limits)
    upstream_need = limits.upstream_requests + limits.upstream_watches
    share = max(available // 2, available - upstream_need) // max(1, len(drivers))
    if drivers_need > len(drivers) * share:
        unauthenticated = min(limits.connections_unauthenticated, max(4, share // 4))
        total = min(limits.connections_total, max(8, share - unauthenticated))
        fitted = replace(
            fitted, connections_total=total, connections_unauthenticated=unauthenticated
        )
    upstream = max(available // 2, available - drivers_need)
    if upstream_need > upstream:
        requests = max(4, upstream // 4)
        fitted = replace(fitted, upstream_requests=requests, upstream_watches=upstream - requests)
    log.warning(
        "connection limits lowered to fit %d descriptors: listeners=%s connections_total=%d "
        "connections_unauthenticated=%d health_connections=%d upstream_requests=%d "
        "upstream_watches=%d",
        soft_limit,
        ",".join(sorted(kinds)),
        fitted.connections_total,
        fitted.connections_unauthenticated,
        fitted.health_connections,
        fitted.upstream_requests,
        fitted.upstream_watches,
    )
    if (needed := descriptor_budget(fitted, kinds)) > soft_limit:
        log.warning(
            "the descriptor limit %d is below the %d the smallest connection limits need: "
            "raise RLIMIT_NOFILE",
            soft_limit,
            needed,
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
