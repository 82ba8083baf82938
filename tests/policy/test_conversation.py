"""The engine's one conversation, driven three ways — by the proxy (real HTTP on a Unix socket,
the embedded API server upstream), by ``audit check`` (the proxy's own audit log as its
readers) and offline (:func:`~gatekeeper.testing.harness.decide_offline`) — decides the same
requests alike, the plain-JSON get included (answered from the gatekeeper's read)."""

from __future__ import annotations

import json
from typing import Any

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import AuditLevel
from gatekeeper.audit.tools.check import check_records
from gatekeeper.audit.tools.reader import to_record
from gatekeeper.policy import Engine, Policy
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.server.config import AuditSettings
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    PKI,
    RecordingSink,
    decide_offline,
    running_gatekeeper,
    seed,
    slice_body,
)
from gatekeeper.types import Identity

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
PINNED = f"fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{GPU}"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
MERGE = "application/merge-patch+json"
AUDIT = AuditSettings(level=AuditLevel.REQUEST_RESPONSE)
CALLER = Identity(driver=GPU, transport="unix")

# (method, target, body, content type, Accept): each against the store as the previous left it.
REQUESTS: list[tuple[str, str, Any, str, str]] = [
    ("GET", f"{SLICES}/node-a-gpu-0", None, "", ""),
    ("GET", f"{SLICES}/node-a-gpu-0", None, "", TABLE),
    ("GET", f"{SLICES}/node-a-nic-0", None, "", ""),
    ("GET", f"{SLICES}?{PINNED}", None, "", ""),
    ("GET", SLICES, None, "", ""),
    ("POST", SLICES, slice_body(name="node-a-gpu-1"), "application/json", ""),
    ("POST", SLICES, slice_body(name="node-a-gpu-2", node="node-b"), "application/json", ""),
    ("PATCH", f"{SLICES}/node-a-gpu-1", {"metadata": {"labels": {"a": "b"}}}, MERGE, ""),
    ("PATCH", f"{SLICES}/node-a-nic-0", {"metadata": {"labels": {"a": "b"}}}, MERGE, ""),
    ("DELETE", f"{SLICES}/node-a-gpu-1", None, "", ""),
    ("DELETE", f"{SLICES}/node-a-nic-0", None, "", ""),
    ("GET", "/apis/apps/v1/deployments", None, "", ""),
]


async def test_proxy_audit_check_and_offline_decide_alike(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    seed(apiserver, name="node-a-gpu-0")
    seed(apiserver, name="node-a-nic-0", driver=NIC)
    sink = RecordingSink()
    engine = Engine(policy, NODE)
    offline: list[tuple[bool, str]] = []
    async with (
        running_gatekeeper(apiserver, policy, pki, audit_sink=sink, audit=AUDIT) as running,
        running.unix_session(GPU) as session,
    ):
        for method, target, body, content_type, accept in REQUESTS:
            info = parse_request(method, target)
            stored = None
            if info.name:
                stored = apiserver.get("resource.k8s.io", "resourceslices", info.name)
            media_type = content_type or "application/json"
            decision = decide_offline(
                engine, CALLER, info, body, stored, media_type=media_type, accept=accept
            )
            offline.append((decision.allowed, decision.reason))
            headers = {"Accept": accept} if accept else {}
            if content_type:
                headers["Content-Type"] = content_type
            data = None if body is None else json.dumps(body)
            async with session.request(method, target, data=data, headers=headers) as answer:
                await answer.read()
    events = [e for e in sink.events if e.get("stage") == "ResponseComplete"]
    assert len(events) == len(REQUESTS)
    proxied = [
        (
            e["annotations"]["authorization.k8s.io/decision"] == "allow",
            e["annotations"]["authorization.k8s.io/reason"],
        )
        for e in events
    ]
    assert proxied == offline
    # A plain-JSON get is answered from the gatekeeper's own read, offline too.
    assert offline[0][1] != offline[1][1]
    report = check_records([to_record(e, {}) for e in events], policy)
    assert report.changes == []
    # Refusals for another driver's object are re-decided only where the log shows that object.
    assert sum(report.decided.values()) + sum(report.skipped.values()) == len(REQUESTS)
    assert sum(report.decided.values()) >= 9
