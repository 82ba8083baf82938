"""Metrics from audit events: requests, refusals, open watches; the exposition parses."""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import NullSink
from gatekeeper.policyfile import load_policy
from gatekeeper.rule import Rule
from gatekeeper.server.metrics import MeteredSink, Metrics
from gatekeeper.testing.harness import (
    GPU,
    SLICES,
    RecordingSink,
    Running,
    metric_samples,
    metric_value,
    slice_body,
)

POLICY = load_policy(None).with_drivers(frozenset({GPU}))


def served_metrics() -> Metrics:
    """Metrics of a gatekeeper serving the default policy for the GPU driver."""
    metrics = Metrics()
    metrics.policy = lambda: POLICY
    return metrics


def event(stage: str = "ResponseComplete", **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "auditID": "a1",
        "stage": stage,
        "verb": "get",
        "user": {"username": "gpu.example.com"},
        "objectRef": {
            "resource": "resourceclaims",
            "subresource": "status",
            "apiGroup": "resource.k8s.io",
        },
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
                        "authorization.k8s.io/reason": 'spec.pool.name "x" is not prefixed by '
                        'node name "node-a"',
                        "dra-gatekeeper.io/rule": "pool-prefix",
                    },
                    responseStatus={"code": 403},
                )
            ]
            * 2,
            "dra_gatekeeper_refusals_total",
            {"driver": "gpu.example.com", "reason": "pool-prefix"},
            2,
            id="refusals-by-rule",
        ),
        pytest.param(
            [
                event(
                    verb="PROPFIND",
                    user={"username": "mallory.example.com"},
                    objectRef={"resource": "secrets-abc123", "apiGroup": ""},
                    annotations={
                        "authorization.k8s.io/decision": "forbid",
                        "authorization.k8s.io/reason": "the gatekeeper policy does not allow "
                        "this resource",
                    },
                    responseStatus={"code": 403},
                )
            ],
            "dra_gatekeeper_requests_total",
            {
                "driver": "unknown",
                "verb": "other",
                "resource": "other",
                "decision": "forbid",
                "code": "403",
            },
            1,
            id="client-chosen-values-are-not-labels",
        ),
        pytest.param(
            [event(user={}, objectRef=None, annotations={}, responseStatus={"code": 401})],
            "dra_gatekeeper_requests_total",
            {
                "driver": "unknown",
                "verb": "get",
                "resource": "-",
                "decision": "none",
                "code": "401",
            },
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
    metrics = served_metrics()
    for item in events:
        metrics.record_event(item)
    assert metric_value(metrics.render().decode(), name, **labels) == expected


def test_refusal_labels_are_rules_never_reasons() -> None:
    """The label is the rule the event names (a fixed set), else the code's: never text of the
    reason, and never a value the event makes up."""
    metrics = served_metrics()
    for index in range(250):
        annotations = {
            "authorization.k8s.io/decision": "forbid",
            "authorization.k8s.io/reason": f"reason {index}",
            "dra-gatekeeper.io/rule": ["pool-prefix", f"made-up-{index}", "cel-validation"][
                index % 3
            ],
        }
        metrics.record_event(event(auditID=str(index), annotations=annotations))
    metrics.record_event(
        event(auditID="x", annotations={"authorization.k8s.io/decision": "forbid"})
    )
    reasons = {
        dict(labels)["reason"]
        for (name, labels) in metric_samples(metrics.render().decode())
        if name == "dra_gatekeeper_refusals_total"
    }
    assert reasons == {"pool-prefix", "other", "cel-validation"}
    assert reasons <= {rule.value for rule in Rule}


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


async def test_metered_sink_is_writable_exactly_when_its_sink_is() -> None:
    inner = RecordingSink()
    sink = MeteredSink(inner, Metrics())
    assert sink.writable is True
    inner.writable = False
    assert sink.writable is False


async def test_creates_with_random_pool_names_add_no_series(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """Five refused creates with pool names a driver chose: the same series, counted five times;
    the audit events keep each whole reason."""
    metrics = gatekeeper.server.metrics
    async with gatekeeper.unix_session(GPU) as session:
        for index in range(5):
            pool = f"pool-{secrets.token_hex(6)}"
            body = slice_body(name=f"node-a-gpu-{index}", pool=pool)
            response = await session.post(SLICES, json=body)
            assert response.status == 403
            assert pool in (await response.json())["message"]
            if index == 0:
                series = set(metric_samples(metrics.render().decode()))
        after = metric_samples(metrics.render().decode())
    assert set(after) == series
    refusals = {k: v for k, v in after.items() if k[0] == "dra_gatekeeper_refusals_total"}
    assert refusals == {
        ("dra_gatekeeper_refusals_total", (("driver", GPU), ("reason", "pool-prefix"))): 5.0
    }
    assert apiserver.journal == []


@pytest.mark.parametrize(
    ("target", "rule"),
    [
        (SLICES + "?continue=abc", "selector-required"),
        ("/apis/resource.k8s.io/v1/resourceclaims?continue=abc", "continue-refused"),
        ("/api/v1/secrets", "kind-not-allowed"),
        (SLICES + "?fieldselector=x", "bad-query"),
        (SLICES + "/x/", "bad-path"),
    ],
)
async def test_the_rule_is_the_one_the_refusal_was_made_with(
    gatekeeper: Running, target: str, rule: str
) -> None:
    sink = gatekeeper.server.metrics
    async with gatekeeper.unix_session(GPU) as session, session.get(target) as response:
        assert response.status in (400, 403)
    refusals = {
        dict(labels)["reason"]: value
        for (name, labels), value in metric_samples(sink.render().decode()).items()
        if name == "dra_gatekeeper_refusals_total"
    }
    assert refusals == {rule: 1.0}
