"""build_event: the fields of DESIGN §4.7, bodies only where allowed, never secrets."""

from __future__ import annotations

from typing import Any

import pytest

from gatekeeper.audit import AuditLevel, build_event, client_audit_id
from gatekeeper.audit.flow import Flow
from gatekeeper.listen.identity import Identity
from gatekeeper.policy.decision import deny
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.rule import Rule

GPU = "gpu.example.com"


def flow(method: str, target: str, body: Any = None, code: int = 200) -> Flow:
    made = Flow(
        method=method,
        raw_target=target,
        source_ips=("127.0.0.1",),
        user_agent="test",
        node_name="node-a",
        identity=Identity(GPU, "mtls", {"certSerial": "0A1B"}),
        info=parse_request(method, target),
        body=body,
    )
    made.response_object = {"kind": "Thing", "metadata": {}}
    made.finish(code)
    return made


@pytest.mark.parametrize(
    ("method", "target", "logged"),
    [
        ("POST", "/apis/resource.k8s.io/v1/resourceslices", True),
        ("POST", "/api/v1/namespaces/ns/secrets", False),
        ("PUT", "/api/v1/namespaces/ns/configmaps/c", False),
        ("POST", "/api/v1/namespaces/ns/serviceaccounts/sa/token", False),
        ("POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", False),
        ("GET", "/version", False),
    ],
)
def test_bodies_only_where_they_may_be_logged(method: str, target: str, logged: bool) -> None:
    event = build_event(flow(method, target, body={"data": "x"}), AuditLevel.REQUEST_RESPONSE)
    assert ("requestObject" in event) is (logged and method != "GET")
    assert ("responseObject" in event) is logged


def test_event_fields() -> None:
    made = flow("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status")
    event = build_event(made, AuditLevel.METADATA)
    assert event["objectRef"] == {
        "resource": "resourceclaims",
        "namespace": "ns",
        "name": "c",
        "apiGroup": "resource.k8s.io",
        "apiVersion": "v1",
        "subresource": "status",
    }
    assert event["user"] == {
        "username": GPU,
        "groups": ["dra-gatekeeper:drivers"],
        "extra": {
            "authentication.kubernetes.io/node-name": ["node-a"],
            "dra-gatekeeper.io/transport": ["mtls"],
            "dra-gatekeeper.io/peer-certSerial": ["0A1B"],
        },
    }
    assert event["stageTimestamp"].endswith("Z") and len(event["stageTimestamp"]) == 27
    assert event["annotations"] == {}  # no decision was recorded on this flow


def test_refusal_is_forbid_with_reason() -> None:
    made = flow("GET", "/version", code=403)
    made.decision = deny(
        403, "header Impersonate-User is not allowed", rule=Rule.HEADER_NOT_ALLOWED
    )
    made.status_message = made.decision.message
    event = build_event(made, AuditLevel.METADATA)
    assert event["annotations"] == {
        "authorization.k8s.io/decision": "forbid",
        "authorization.k8s.io/reason": "header Impersonate-User is not allowed",
        "dra-gatekeeper.io/rule": "header-not-allowed",
    }
    assert event["responseStatus"]["status"] == "Failure"


def test_failure_before_a_decision_is_annotated() -> None:
    made = flow("GET", "/apis/resource.k8s.io/v1/resourceslices/x", code=503)
    made.status_message = "upstream unreachable"
    event = build_event(made, AuditLevel.METADATA)
    assert event["annotations"] == {"dra-gatekeeper.io/error": "upstream unreachable"}


@pytest.mark.parametrize(
    ("header", "hint"),
    [("abc-123", "abc-123"), ("x" * 65, ""), ("a b", ""), ("é", ""), ("", "")],
)
def test_client_audit_id_is_sanitized(header: str, hint: str) -> None:
    assert client_audit_id({"Audit-ID": header}) == hint
