"""The bodies that made one driver's request stall every driver: a 1 MB body with a 100-bit integer
90 levels deep beside the driver's own selector (the runtime's conversion error quoted the object
at every level: a 93 MB answer and audit event after 5 s), and messages an expression makes from
the body. Through the real gatekeeper, over a Unix socket, with its audit log: the answer and
the audit event stay small, and the answer comes at once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import AuditLevel
from gatekeeper.cli.served import served_kinds
from gatekeeper.messages import MAX_MESSAGE
from gatekeeper.policy import Engine
from gatekeeper.policyfile import load_policy, parse_policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.server.config import AuditSettings
from gatekeeper.testing.harness import NODE_TOKEN, PKI, decide_offline, running_gatekeeper
from gatekeeper.types import Identity

REPO = Path(__file__).resolve().parents[2]
GAUDI = "gaudi.intel.com"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


def deep(levels: int, number: int) -> dict[str, Any]:
    value: dict[str, Any] = {"n": number}
    for _ in range(levels):
        value = {"x": value}
    return value


def taint_rule(pool: str, size: int, **spec: Any) -> dict[str, Any]:
    """A DeviceTaintRule of the Gaudi driver, padded to ``size`` bytes."""
    rule: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "r1"},
        "spec": {
            "deviceSelector": {"driver": GAUDI, "pool": pool, "device": "0000-b4-00-0-0x1020"},
            "taint": {"key": f"{GAUDI}/unhealthy", "value": "x", "effect": "NoExecute"},
            **spec,
        },
    }
    rule["metadata"]["annotations"] = {"pad": "p" * max(0, size - len(json.dumps(rule)))}
    return rule


@pytest.mark.parametrize(
    ("pool", "code"),
    [("node-a", 201), ("node-b", 403)],
    ids=["own-selector", "another-nodes-selector"],
)
async def test_a_deep_integer_body_is_decided_at_once_with_a_small_answer(
    pki: PKI, tmp_path: Path, pool: str, code: int
) -> None:
    policy = load_policy(str(REPO / "policies" / "intel-gaudi.yaml"))
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    await apiserver.start()
    log = tmp_path / "audit.log"
    audit = AuditSettings(path=str(log), level=AuditLevel.METADATA)
    body = taint_rule(pool, 1_000_000, selectorExtra=deep(90, 2**100))
    payload = json.dumps(body).encode()
    assert len(payload) >= 1_000_000
    try:
        async with (
            running_gatekeeper(apiserver, policy, pki, audit=audit) as running,
            running.unix_session(GAUDI) as session,
        ):
            started = time.monotonic()
            headers = {"Content-Type": "application/json"}
            async with session.post(RULES, data=payload, headers=headers) as response:
                answer = await response.read()
                status = response.status
            elapsed = time.monotonic() - started
    finally:
        await apiserver.close()
    assert status == code, answer[:2000]
    # Not a benchmark: the body took 5 s and answered 93 MB before; anything near that fails.
    assert elapsed < 2.0
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (event,) = [e for e in events if e["requestURI"] == RULES]
    if code == 403:
        assert len(answer) < 2 * MAX_MESSAGE
        status_body = json.loads(answer)
        assert "is not the caller's" in status_body["message"]
        assert len(json.dumps(event)) < 2 * MAX_MESSAGE
    else:  # allowed: the apiserver's answer (the object it stored), the event at Metadata
        assert len(json.dumps(event)) < 4096


def test_a_message_made_from_the_body_is_capped() -> None:
    """A messageExpression (and the error of one that fails) says what the body makes it say:
    the refusal's message, its reason and so the audit annotation are cut to 5 KiB."""
    policy = parse_policy(
        """\
apiVersion: dra-gatekeeper.io/v1alpha1
kind: Policy
drivers: [gaudi.intel.com]
kinds:
  - group: resource.k8s.io
    resource: devicetaintrules
    kind: DeviceTaintRule
    scope: Cluster
    rule: CEL
    verbs: [create]
    versions:
      - names: [v1beta2]
        scope: object.spec.deviceSelector.driver == variables.driver
        validations:
          - name: effect
            expression: object.spec.taint.effect == 'NoExecute'
            messageExpression: "'not ' + object.spec.taint.effect"
""",
        "p.yaml",
    )
    body = taint_rule("node-a", 200_000)
    body["spec"]["taint"]["effect"] = "E" * 150_000
    decision = decide_offline(
        Engine(policy, "node-a"), Identity(GAUDI, "unix"), parse_request("POST", RULES), body
    )
    assert (decision.allowed, decision.validation) == (False, "effect")
    assert len(decision.message) <= MAX_MESSAGE and len(decision.reason) <= MAX_MESSAGE
    assert decision.message.endswith("more characters)")


@pytest.mark.parametrize(
    ("number", "allowed", "why"),
    [(2**100, True, ""), (10**400, False, "a number beyond a float64")],
    ids=["converted-as-go", "beyond-float64"],
)
def test_a_large_integer_in_what_is_read_whole(number: int, allowed: bool, why: str) -> None:
    """Read whole (compared), the selector's deep integer is a float64, as Go's JSON reads it at
    the apiserver; one beyond a float64 refuses, in a short message."""
    policy = load_policy(str(REPO / "policies" / "intel-gaudi.yaml"))
    rules = policy.kinds[("resource.k8s.io", "devicetaintrules")].versions["v1beta2"].cel
    assert rules.analysis is not None
    body = taint_rule("node-a", 10_000, deviceSelectorCopy=None)
    body["spec"]["deviceSelector"]["extra"] = deep(90, number)
    decision = decide_offline(
        Engine(
            parse_policy(
                (REPO / "policies" / "intel-gaudi.yaml")
                .read_text()
                .replace(
                    "variables.selector.?device.orValue('') != ''",
                    "variables.selector.?device.orValue('') != '' && "
                    "variables.selector == variables.selector",
                ),
                "intel-gaudi.yaml",
                directory=str(REPO / "policies"),
            ),
            "node-a",
        ),
        Identity(GAUDI, "unix"),
        parse_request("POST", RULES),
        body,
    )
    assert decision.allowed is allowed, decision.message
    if not allowed:
        assert why in decision.message and len(decision.message) < 2048
