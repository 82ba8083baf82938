"""Metrics from audit events: requests, refusals, open watches; the exposition parses."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.audit import NullSink
from gatekeeper.metrics import MeteredSink, Metrics
from gatekeeper.testing.harness import metric_samples, metric_value


def event(stage: str = "ResponseComplete", **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "auditID": "a1",
        "stage": stage,
        "verb": "get",
        "user": {"username": "gpu.example.com"},
        "objectRef": {"resource": "resourceclaims", "subresource": "status"},
        "responseStatus": {"code": 200},
        "annotations": {"authorization.k8s.io/decision": "allow"},
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("events", "name", "labels", "expected"),
    [
        pytest.param(
            [event()],
            "dra_gatekeeper_requests_total",
            {
                "driver": "gpu.example.com",
                "verb": "get",
                "resource": "resourceclaims/status",
                "decision": "allow",
                "code": "200",
            },
            1,
            id="allowed-with-subresource",
        ),
        pytest.param(
            [
                event(
                    annotations={
                        "authorization.k8s.io/decision": "forbid",
                        "authorization.k8s.io/reason": "pool not prefixed",
                    },
                    responseStatus={"code": 403},
                )
            ]
            * 2,
            "dra_gatekeeper_refusals_total",
            {"driver": "gpu.example.com", "reason": "pool not prefixed"},
            2,
            id="refusals-by-reason",
        ),
        pytest.param(
            [event(user={}, objectRef=None, annotations={}, responseStatus={"code": 401})],
            "dra_gatekeeper_requests_total",
            {"driver": "-", "verb": "get", "resource": "-", "decision": "none", "code": "401"},
            1,
            id="no-identity",
        ),
        pytest.param(
            [event("ResponseStarted", verb="watch")],
            "dra_gatekeeper_watches_open",
            {"driver": "gpu.example.com"},
            1,
            id="watch-started",
        ),
        pytest.param(
            [event("ResponseStarted", verb="watch"), event(verb="watch")],
            "dra_gatekeeper_watches_open",
            {"driver": "gpu.example.com"},
            0,
            id="watch-ended",
        ),
    ],
)
def test_record_event(
    events: list[dict[str, Any]], name: str, labels: dict[str, str], expected: float
) -> None:
    metrics = Metrics()
    for item in events:
        metrics.record_event(item)
    assert metric_value(metrics.render().decode(), name, **labels) == expected


def test_refusal_reasons_are_bounded() -> None:
    metrics = Metrics()
    for index in range(250):
        metrics.record_event(
            event(
                auditID=str(index),
                annotations={
                    "authorization.k8s.io/decision": "forbid",
                    "authorization.k8s.io/reason": f"reason {index}",
                },
            )
        )
    reasons = {
        dict(labels)["reason"]
        for (name, labels) in metric_samples(metrics.render().decode())
        if name == "dra_gatekeeper_refusals_total"
    }
    assert len(reasons) == 201 and "other" in reasons


async def test_metered_sink_counts_and_passes_every_event_on() -> None:
    seen: list[dict[str, Any]] = []

    class Recording(NullSink):
        async def emit(self, item: dict[str, Any]) -> None:
            seen.append(item)

    metrics = Metrics()
    sink = MeteredSink(Recording(), metrics)
    await sink.emit(event())
    await sink.emit({"not": "an audit event"})
    await sink.aclose()
    assert len(seen) == 2
    total = sum(
        v
        for (name, _), v in metric_samples(metrics.render().decode()).items()
        if name == "dra_gatekeeper_requests_total"
    )
    assert total == 2


def test_callers_that_are_no_driver_share_one_series() -> None:
    """A certificate the CA signed for a name the policy does not list: its CN appears in no
    label value (driver, or a refusal reason naming it), however many such names come."""
    metrics = Metrics(is_driver=lambda name: name == "gpu.example.com")
    for index in range(50):
        metrics.record_event(
            event(
                auditID=str(index),
                user={"username": f"stranger-{index}.example.com"},
                responseStatus={"code": 403},
                annotations={
                    "authorization.k8s.io/decision": "forbid",
                    "authorization.k8s.io/reason": f'driver "stranger-{index}.example.com" is '
                    'not allowed on node "node-a"',
                },
            )
        )
    metrics.record_event(event(user={"username": "system:anonymous"}, annotations={
        "authorization.k8s.io/decision": "forbid", "authorization.k8s.io/reason": "no identity"
    }))  # fmt: skip
    samples = metric_samples(metrics.render().decode())
    assert "stranger" not in repr(samples)
    refusals = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "dra_gatekeeper_refusals_total"
    }
    assert refusals == {
        (("driver", "-"), ("reason", "the caller is not a driver allowed on this node")): 50,
        (("driver", "-"), ("reason", "no identity")): 1,
    }
