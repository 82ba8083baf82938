"""Prometheus metrics for ``/metrics``: what the gatekeeper decided, how the upstream answers.

One :class:`Metrics` per server, on its own registry. Per-request figures are taken from the
audit events (:class:`MeteredSink` sees every finished request, allowed or refused, exactly as
it is audited); in-flight requests from the pipeline's own count; upstream latency from the
upstream session's answer hook; the rest by the parts that know (TLS, reloads, certificates,
the audit writer, the listeners' connections). A scrape costs at most one render per
:data:`SCRAPE_INTERVAL`, however many clients scrape (:meth:`Metrics.scrape`).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import Counter as CounterType
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import aiohttp
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gatekeeper.audit import AuditSink, JsonLinesWriter
from gatekeeper.audit.event import RULE_ANNOTATION
from gatekeeper.listen.identity import TokenFailure
from gatekeeper.rule import Rule
from gatekeeper.upstream.session import AnswerHook

__all__ = [
    "CONTENT_TYPE",
    "SCRAPE_INTERVAL",
    "UNKNOWN_DRIVER",
    "LabelPolicy",
    "MeteredSink",
    "Metrics",
    "UpstreamWatches",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_UNKNOWN = "-"
UNKNOWN_DRIVER = "unknown"
"""The driver label of a caller that is not a driver the policy allows."""
_VERBS = frozenset(
    {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
SCRAPE_INTERVAL = 0.25
"""Seconds between two renders of ``/metrics`` at least (a render runs on the event loop the
drivers' requests run on: 60 clients scraping back to back once took their latency from 2 to
106 ms)."""


class LabelPolicy(Protocol):
    """What label values are checked against: the policy being served."""

    def allows_driver(self, driver: str) -> bool: ...

    def kind_for(self, group: str, resource: str) -> Any: ...


class Metrics:
    """Every metric of one gatekeeper, registered on ``registry``.

    Label values come from fixed sets, never from what a client sends (a new value is a new
    series, held forever): drivers the policy allows (else ``unknown``), its kinds (else
    ``other``), the API verbs, HTTP codes, and the rule that refused
    (:class:`~gatekeeper.rule.Rule`, as the audit event carries it).
    """

    def __init__(self, *, scrape_interval: float = SCRAPE_INTERVAL) -> None:
        self.policy: Callable[[], LabelPolicy] | None = None
        """The policy now served (set by the server): which drivers and kinds are known."""
        self.exposition = _Exposition(self.render, scrape_interval)
        """The renders ``/metrics`` answers with (:meth:`scrape`)."""
        self.registry = CollectorRegistry()
        self._watch_drivers: dict[str, str] = {}
        self._request_metrics(self.registry)
        self._part_metrics(self.registry)

    def _request_metrics(self, r: CollectorRegistry) -> None:
        """What requests do: counted from their audit events, and the upstream's answers."""
        self.requests = Counter(
            "dra_gatekeeper_requests",
            "Finished requests by driver, verb, resource, decision and HTTP code.",
            ["driver", "verb", "resource", "decision", "code"],
            registry=r,
        )
        self.refusals = Counter(
            "dra_gatekeeper_refusals",
            "Requests the gatekeeper refused, by driver and the rule that refused (the audit "
            "event has the whole reason).",
            ["driver", "reason"],
            registry=r,
        )
        self.upstream_latency = Histogram(
            "dra_gatekeeper_upstream_request_duration_seconds",
            "Time until the upstream API server's response headers, by method.",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.watches = Gauge(
            "dra_gatekeeper_watches_open", "Watches streaming, by driver.", ["driver"], registry=r
        )

    def _part_metrics(self, r: CollectorRegistry) -> None:
        """What the parts that know report: TLS, token reviews, reloads, certificates."""
        self.tls_failures = Counter(
            "dra_gatekeeper_tls_handshake_failures",
            "Failed TLS handshakes on the mTLS listener, by reason.",
            ["reason"],
            registry=r,
        )
        self.token_reviews = Counter(
            "dra_gatekeeper_token_reviews",
            "Bearer tokens of the token listener looked up, by result: authenticated, "
            "unauthenticated or error (TokenReviews asked of the apiserver), or cached.",
            ["result"],
            registry=r,
        )
        self.token_failures = Counter(
            "dra_gatekeeper_token_failures",
            "Requests on the token listener that were no driver's, by reason: no-bearer, "
            "rate-limited (review budget), review-unavailable, rejected (by the TokenReview), "
            "unmapped-service-account, unbound, wrong-node.",
            ["reason"],
            registry=r,
        )
        for failure in TokenFailure:
            self.token_failures.labels(failure.value)  # every series from the start, at 0
        self.cert_requests = Counter(
            "dra_gatekeeper_certificate_requests",
            "CertificateSigningRequests of the token listener's serving certificate, by how "
            "each wait ended: issued, denied, failed, gone (deleted), waiting (no answer in "
            "--token-cert-wait: waited on again), error (could not be made).",
            ["result"],
            registry=r,
        )
        self.reloads = Counter(
            "dra_gatekeeper_reloads",
            "Reloads of a watched file (policy, token, tls), by result (ok or error).",
            ["file", "result"],
            registry=r,
        )
        self.cert_expiry = Gauge(
            "dra_gatekeeper_certificate_expiry_seconds",
            "Seconds until a certificate expires (serving, token-listener, client CA).",
            ["certificate"],
            registry=r,
        )
        self.cert_expiring = Gauge(
            "dra_gatekeeper_certificate_expiring",
            "1 when a certificate expires within the warning period, else 0.",
            ["certificate"],
            registry=r,
        )
        self.ready = Gauge("dra_gatekeeper_ready", "1 when /readyz answers ok.", registry=r)

    def token_failed(self, failure: TokenFailure) -> None:
        """Count a token listener request that was no driver's."""
        self.token_failures.labels(failure.value).inc()

    def render(self) -> bytes:
        """The exposition text, rendered now."""
        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """The exposition text for a ``/metrics`` request: rendered after the request arrived
        (it shows everything counted before), at most once per ``scrape_interval`` and one
        render at a time, shared by every scrape waiting for it."""
        return await self.exposition.next()

    def watch_audit(self, writer: JsonLinesWriter) -> None:
        """Export the audit writer's queue depth and counters."""
        self.registry.register(_AuditCollector(writer))

    # --- label values from fixed sets ----------------------------------------------------

    def driver_label(self, driver: str) -> str:
        """``driver`` if the policy allows it, else ``unknown``."""
        policy = self.policy() if self.policy is not None else None
        if policy is not None and driver and policy.allows_driver(driver):
            return driver
        return UNKNOWN_DRIVER

    def _resource_label(self, ref: dict[str, Any]) -> str:
        resource, group = ref.get("resource"), str(ref.get("apiGroup") or "")
        if not resource:
            return _UNKNOWN  # a non-resource path (discovery, /version)
        policy = self.policy() if self.policy is not None else None
        kind = policy.kind_for(group, str(resource)) if policy is not None else None
        if kind is None:
            return "other"
        subresource = ref.get("subresource")
        if subresource:
            return f"{resource}/{subresource}" if subresource in kind.subresources else "other"
        return str(resource)

    # --- from audit events ---------------------------------------------------------------

    def record_event(self, event: dict[str, Any]) -> None:
        """Count one audit event: a finished request, or a watch that started streaming."""
        user = event.get("user") or {}
        driver = self.driver_label(str(user.get("username") or ""))
        audit_id = str(event.get("auditID", ""))
        if event.get("stage") == "ResponseStarted":
            self._watch_drivers[audit_id] = driver
            self.watches.labels(driver).inc()
            return
        if (started := self._watch_drivers.pop(audit_id, None)) is not None:
            self.watches.labels(started).dec()
        resource = self._resource_label(event.get("objectRef") or {})
        annotations = event.get("annotations") or {}
        decision = annotations.get("authorization.k8s.io/decision")
        decision = decision if decision in ("allow", "forbid") else "none"
        code = int((event.get("responseStatus") or {}).get("code", 0) or 0)
        verb = str(event.get("verb") or "")
        verb = verb if verb in _VERBS else "other"
        self.requests.labels(driver, verb, resource, decision, str(code)).inc()
        if decision == "forbid":
            # The rule the refusal was made with (a fixed set), never read from its message.
            label = annotations.get(RULE_ANNOTATION)
            rule = Rule.of_label(label) if isinstance(label, str) else Rule.for_code(code)
            self.refusals.labels(driver, rule.value).inc()

    # --- in-flight requests ----------------------------------------------------------------

    def watch_in_flight(self, counts: Callable[[], CounterType[str]]) -> None:
        """Export the one in-flight count (requests and watches being served, per driver)."""
        self.registry.register(_InFlightCollector(counts, self.driver_label))

    # --- upstream --------------------------------------------------------------------------

    def upstream_answer(self, watches: UpstreamWatches) -> AnswerHook:
        """Times the upstream's answers, and keeps its open watches for a clean shutdown."""
        histogram = self.upstream_latency

        def on_answer(
            method: str, seconds: float, response: aiohttp.ClientResponse, watch: bool
        ) -> None:
            histogram.labels(method).observe(seconds)
            if watch:
                watches.add(response)

        return on_answer


class UpstreamWatches:
    """The upstream watch responses still open: ended cleanly on shutdown."""

    def __init__(self) -> None:
        self._responses: weakref.WeakSet[aiohttp.ClientResponse] = weakref.WeakSet()

    def add(self, response: aiohttp.ClientResponse) -> None:
        self._responses.add(response)

    def end_all(self) -> int:
        """End every open watch stream as if the apiserver had closed it; how many were open.

        Reading from the upstream is paused first, so nothing arrives after the end; the
        proxy then finishes the driver's response normally (its informer re-lists/re-watches).
        """
        ended = 0
        for response in list(self._responses):
            if response.closed or response.content.is_eof():
                continue
            connection = response.connection
            if connection is not None:
                if connection.protocol is not None:
                    connection.protocol.force_close()  # never back into the pool
                if connection.transport is not None:
                    connection.transport.pause_reading()
            response.content.feed_eof()
            ended += 1
        return ended


class MeteredSink:
    """An audit sink that counts every event in :class:`Metrics`, then passes it on."""

    def __init__(self, inner: AuditSink, metrics: Metrics) -> None:
        self.inner = inner
        self._metrics = metrics

    async def emit(self, event: dict[str, Any]) -> None:
        try:
            self._metrics.record_event(event)
        finally:
            await self.inner.emit(event)

    def close(self) -> None:
        self.inner.close()

    async def aclose(self) -> None:
        await self.inner.aclose()

    @property
    def writable(self) -> bool:
        """Whether the wrapped sink can write."""
        return self.inner.writable


class _InFlightCollector(Collector):
    """``dra_gatekeeper_requests_in_flight{driver}``, read from the pipeline's own count; a
    driver once seen keeps its series (at 0), as a gauge's child would."""

    def __init__(self, counts: Callable[[], CounterType[str]], label: Callable[[str], str]) -> None:
        self._counts = counts
        self._label = label
        self._seen: set[str] = set()

    def collect(self) -> Iterator[Any]:
        labelled: CounterType[str] = CounterType()
        for driver, count in self._counts().items():
            labelled[self._label(driver)] += count
        self._seen |= set(labelled)
        family = GaugeMetricFamily(
            "dra_gatekeeper_requests_in_flight",
            "Requests being served, by driver.",
            labels=["driver"],
        )
        for driver in sorted(self._seen):
            family.add_metric([driver], float(labelled[driver]))
        yield family


class _Exposition:
    """Renders paced for scrapers: a scrape waits for the first render that starts after it
    arrived; renders start at least ``interval`` seconds apart. A scraper that asks back to back
    is answered once per interval, and any number of them cost one render per interval."""

    def __init__(
        self,
        render: Callable[[], bytes],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._render = render
        self._interval = interval
        self._clock = clock
        self._started = -interval
        self._pending: asyncio.Future[bytes] | None = None
        self.renders = 0
        """Renders made for scrapes."""

    async def next(self) -> bytes:
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._render_in_turn())
        # Shielded: a scraper that goes away does not cancel the others' render.
        return await asyncio.shield(self._pending)

    async def _render_in_turn(self) -> bytes:
        wait = self._started + self._interval - self._clock()
        if wait > 0:
            await asyncio.sleep(wait)
        # From here on (the render runs without yielding) a new scrape waits for the next one.
        self._pending = None
        self._started = self._clock()
        self.renders += 1
        return self._render()


class _AuditCollector(Collector):
    def __init__(self, writer: JsonLinesWriter) -> None:
        self._writer = writer

    def collect(self) -> Iterator[Any]:
        stats = self._writer.stats
        depth = GaugeMetricFamily(
            "dra_gatekeeper_audit_queue_depth", "Audit events waiting to be written."
        )
        depth.add_metric([], float(self._writer.queue_depth))
        yield depth
        for name, text, value in (
            ("dra_gatekeeper_audit_events_written", "Audit events written.", stats.written),
            (
                "dra_gatekeeper_audit_write_errors",
                "Failed audit writes (retried).",
                stats.write_errors,
            ),
            (
                "dra_gatekeeper_audit_events_lost",
                "Audit events that could not be written.",
                stats.lost,
            ),
        ):
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], float(value))
            yield counter
