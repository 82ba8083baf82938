"""`audit generate` and `audit check` round-trip on ResourceClaim traffic (AllocatedToDriver)."""

from __future__ import annotations

import json
from pathlib import Path

from gatekeeper.audit.tools.cli import run_audit_command
from gatekeeper.policyfile import load_policy


def claim_event(verb: str, uri: str, name: str) -> dict:
    return {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": name,
        "stage": "ResponseComplete",
        "requestURI": uri,
        "verb": verb,
        "user": {
            "username": "gpu.example.com",
            "groups": ["dra-gatekeeper:drivers"],
            "extra": {"authentication.kubernetes.io/node-name": ["node-a"]},
        },
        "sourceIPs": [],
        "userAgent": "test",
        "objectRef": {
            "resource": "resourceclaims",
            "namespace": "default",
            "name": name,
            "apiGroup": "resource.k8s.io",
            "apiVersion": "v1",
        },
        "responseStatus": {"metadata": {}, "code": 200},
        "requestReceivedTimestamp": "2026-12-02T10:00:00.000000Z",
        "stageTimestamp": "2026-12-02T10:00:00.000100Z",
        "annotations": {
            "authorization.k8s.io/decision": "allow",
            "authorization.k8s.io/reason": "in scope",
        },
    }


def test_generate_and_check_round_trip_on_claims(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_text(
        json.dumps(
            claim_event(
                "get", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1", "c1"
            )
        )
        + "\n"
    )
    policy = tmp_path / "generated.yaml"
    assert run_audit_command(["generate", "-o", str(policy), str(log)]) == 0
    spec = load_policy(str(policy)).kind_for("resource.k8s.io", "resourceclaims")
    assert spec is not None and spec.rule.value == "AllocatedToDriver"
    assert run_audit_command(["check", "--policy", str(policy), str(log)]) == 0
