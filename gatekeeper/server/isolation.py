"""``/metrics`` for what no audit event counts: the connections of the listeners, and the objects
dropped from filtered answers."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gatekeeper.listen.capacity import UNAUTHENTICATED, ConnectionGuard
from gatekeeper.proxy.scoped import DROPPED
from gatekeeper.server.metrics import UNKNOWN_DRIVER

__all__ = ["IsolationCollector"]


class IsolationCollector(Collector):
    """``/metrics`` for what no audit event counts: connections refused or cut, objects
    dropped from filtered answers, open connections per listener kind and caller (a driver,
    or ``unauthenticated``: never a value the client chose, so the series stay bounded)."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard

    def collect(self) -> Iterator[Any]:
        guard = self._guard
        known = guard.gatekeeper.engine.policy.allows_driver
        yield _by_caller(
            known,
            CounterMetricFamily(
                "dra_gatekeeper_connections_refused",
                "Connections closed at once as over a connection cap (a driver's: answered 429; "
                "unauthenticated: the oldest closed), by listener kind and caller.",
                labels=["listener", "caller"],
            ),
            guard.refused,
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
            guard.open,
        )


def _total(family: CounterMetricFamily, value: int) -> CounterMetricFamily:
    family.add_metric([], float(value))
    return family


def _by_caller(
    known: Callable[[str], bool],
    family: CounterMetricFamily | GaugeMetricFamily,
    counts: Counter[tuple[str, str]],
) -> CounterMetricFamily | GaugeMetricFamily:
    # A caller is a driver (or "unauthenticated") when counted; one the policy no longer
    # allows (a reload removed it) is "unknown", like every label of a caller not allowed.
    labelled: Counter[tuple[str, str]] = Counter()
    for (listener, caller), count in counts.items():
        label = caller if caller == UNAUTHENTICATED or known(caller) else UNKNOWN_DRIVER
        labelled[(listener, label)] += count
    for (listener, caller), count in labelled.items():
        family.add_metric([listener, caller], float(count))
    return family
