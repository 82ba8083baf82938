"""Every bound that keeps one driver from hurting another (README, "Limits"): the values, their
``serve`` flags, and their fit to the descriptor limit.

A leaf value read by every stage: the per-driver budgets are counted in
:mod:`gatekeeper.proxy.budgets`, connections capped in :mod:`gatekeeper.listen.connections`, the
upstream pools sized in :mod:`gatekeeper.upstream.session`.
"""

from __future__ import annotations

import argparse
import logging
import resource
from dataclasses import dataclass, replace

from gatekeeper.errors import ConfigError

__all__ = [
    "DEFAULT_LIMITS",
    "Limits",
    "add_limit_arguments",
    "fit_to_descriptors",
    "limits_from_flags",
]

log = logging.getLogger("gatekeeper.limits")

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
    "--upstream-review-connections": (
        "upstream_reviews",
        "upstream connections for TokenReviews (the token listener)",
    ),
    "--upstream-connect-timeout": ("upstream_connect_timeout", "seconds to connect upstream"),
    "--upstream-timeout": ("upstream_timeout", "seconds an upstream answer may stall (504)"),
    "--max-token-reviews": (
        "token_reviews",
        "TokenReviews per second for callers no driver's token vouched for yet, whole process",
    ),
    "--max-token-reviews-per-source": (
        "token_reviews_per_source",
        "TokenReviews per second for such callers from one source address (IPv6: one /64)",
    ),
    "--max-token-reviews-per-connection": (
        "token_reviews_per_connection",
        "TokenReviews per second on one token listener connection",
    ),
    "--max-token-refusals-per-connection": (
        "token_refusals_per_connection",
        "answers per second to refused requests on one token listener connection (then held)",
    ),
    "--max-token-reviews-per-driver": (
        "token_reviews_per_driver",
        "TokenReviews per second kept for each driver's own tokens, connections and addresses",
    ),
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
    fixed = _RESERVED_DESCRIPTORS + limits.upstream_own + limits.upstream_reviews
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
