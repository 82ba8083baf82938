"""``/metrics`` for what no audit event counts: the connections of the listeners (the health
listener's too), and the objects dropped from filtered answers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gatekeeper.listen.capacity import UNAUTHENTICATED, ConnectionGuard
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.proxy.scoped import DROPPED
from gatekeeper.server.health import HealthServer
from gatekeeper.server.metrics import UNKNOWN_DRIVER

__all__ = ["IsolationCollector"]


class IsolationCollector(Collector):
    """``/metrics`` for what no audit event counts: connections refused or cut, objects
    dropped from filtered answers, open connections per listener kind and caller (a driver,
    or ``unauthenticated``: never a value the client chose, so the series stay bounded). The
    health listener's connections are anyone's: ``unauthenticated``."""

    def __init__(self, guard: ConnectionGuard, health: HealthServer | None = None) -> None:
        self._guard = guard
        self._health = health

    def collect(self) -> Iterator[Any]:
        guard, health = self._guard, self._health
        known = guard.gatekeeper.engine.policy.allows_driver
        refused, held = Counter(guard.refused), Counter(guard.open)
        if health is not None:
            refused[(ListenerKind.HEALTH, UNAUTHENTICATED)] = health.closed_over_cap
            held[(ListenerKind.HEALTH, UNAUTHENTICATED)] = health.held
        yield _by_caller(
            known,
            CounterMetricFamily(
                "dra_gatekeeper_connections_refused",
                "Connections closed at once as over a connection cap (a driver's: answered 429; "
                "unauthenticated: the oldest closed), by listener kind and caller.",
                labels=["listener", "caller"],
            ),
            refused,
        )
        yield _total(
            CounterMetricFamily(
                "dra_gatekeeper_header_timeouts",
                "Connections closed because a request's headers did not arrive in time.",
            ),
            guard.header_timeouts,
        )
        yield _total(
            CounterMetricFamily(
                "dra_gatekeeper_malformed_requests",
                "Requests aiohttp could not parse (answered with a Status and audited).",
            ),
            guard.malformed,
        )
        yield _total(
            CounterMetricFamily(
                "dra_gatekeeper_unevaluable_objects_dropped",
                "Objects left out of filtered answers because they could not be evaluated.",
            ),
            DROPPED.value,
        )
        yield _by_caller(
            known,
            GaugeMetricFamily(
                "dra_gatekeeper_connections_open",
                "Open connections, by listener kind and caller.",
                labels=["listener", "caller"],
            ),
            held,
        )


def _total(family: CounterMetricFamily, value: int) -> CounterMetricFamily:
    family.add_metric([], float(value))
    return family


def _by_caller(
    known: Callable[[str], bool],
    family: CounterMetricFamily | GaugeMetricFamily,
    counts: Counter[tuple[ListenerKind, str]],
) -> CounterMetricFamily | GaugeMetricFamily:
    # A caller is a driver (or "unauthenticated") when counted; one the policy no longer
    # allows (a reload removed it) is "unknown", like every label of a caller not allowed.
    labelled: Counter[tuple[ListenerKind, str]] = Counter()
    for (listener, caller), count in counts.items():
        label = caller if caller == UNAUTHENTICATED or known(caller) else UNKNOWN_DRIVER
        labelled[(listener, label)] += count
    for (listener, caller), count in labelled.items():
        family.add_metric([listener.value, caller], float(count))
    return family
