"""Audit events of real requests: drivers over real sockets, the embedded API server upstream.

Every decision class yields exactly one event (a watch two), with its decision and reason; the
``Audit-Id`` response header names it; and no request is lost under load.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from importlib import resources
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.audit import AuditLevel
from gatekeeper.limits import Limits
from gatekeeper.policy import Policy
from gatekeeper.policyfile import parse_policy
from gatekeeper.testing.harness import (
    GPU,
    NODE,
    NODE_TOKEN,
    PINNED,
    SLICES,
    Audited,
    seed,
    slice_body,
)
from tests.rawhttp import build_request, send_raw

DECISION = "authorization.k8s.io/decision"
REASON = "authorization.k8s.io/reason"

# (id, how to send it, code, decision, reason substring)
CASES: list[tuple[str, dict[str, Any], int, str, str]] = [
    ("allowed-create", {"method": "POST", "path": SLICES, "json": slice_body()}, 201, "allow", ""),
    (
        "allowed-then-upstream-409",
        {"method": "POST", "path": SLICES, "json": slice_body(name="node-a-seeded")},
        409,
        "allow",
        "",
    ),
    ("allowed-discovery", {"method": "GET", "path": "/apis"}, 200, "allow", "discovery"),
    ("policy-403", {"method": "POST", "path": SLICES, "json": slice_body(pool="other")}, 403,
     "forbid", "not prefixed by node name"),
    ("unpinned-list-403", {"method": "GET", "path": SLICES}, 403, "forbid", "fieldSelector"),
    ("not-found-404", {"method": "GET", "path": f"{SLICES}/node-a-none"}, 404, "forbid",
     "not found"),
    ("path-400", {"method": "GET", "path": f"{SLICES}/"}, 400, "forbid", ""),
    ("header-403", {"method": "GET", "path": f"{SLICES}?{PINNED}",
                    "headers": {"Impersonate-User": "admin"}}, 403, "forbid", "Impersonate-User"),
    ("yaml-415", {"method": "POST", "path": SLICES, "data": b"kind: x",
                  "headers": {"Content-Type": "application/yaml"}}, 415, "forbid", ""),
    ("huge-413", {"method": "POST", "path": SLICES, "data": b" " * (4 * 1024 * 1024),
                  "headers": {"Content-Type": "application/json"}}, 413, "forbid", ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("send", "code", "decision", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
async def test_one_event_per_request_with_its_decision(
    audited: Audited,
    apiserver: APIServer,
    send: dict[str, Any],
    code: int,
    decision: str,
    reason: str,
) -> None:
    seed(apiserver, name="node-a-seeded")
    send = dict(send)
    async with audited.unix_session(GPU) as session:
        response = await session.request(send.pop("method"), send.pop("path"), **send)
        await response.read()
    assert response.status == code
    events = await audited.events()
    assert len(events) == 1
    event = events[0]
    assert event["auditID"] == response.headers["Audit-Id"]
    assert event["stage"] == "ResponseComplete"
    assert event["responseStatus"]["code"] == code
    assert event["annotations"][DECISION] == decision
    assert reason in event["annotations"][REASON]
    assert event["user"]["username"] == GPU
    assert event["user"]["extra"]["authentication.kubernetes.io/node-name"] == [NODE]
    assert event["requestReceivedTimestamp"] <= event["stageTimestamp"]


async def test_a_unix_socket_of_no_driver_is_one_forbid_event(audited: Audited) -> None:
    """A request with no identity (a socket no driver is bound to any more) is refused 401 and
    audited; over mTLS, no certificate means no HTTP at all (refused at the handshake)."""
    path = audited.socket_path(GPU)
    audited.server.identifier.socket_drivers.pop(str(path))
    response = await send_raw(path, build_request("GET", "/version"))
    assert response.status == 401
    (event,) = await audited.events()
    assert event["user"]["username"] == "system:anonymous"
    assert event["annotations"][DECISION] == "forbid"
    assert event["auditID"] == response.headers["audit-id"]


async def test_upstream_unreachable_after_allow(audited: Audited, apiserver: APIServer) -> None:
    await apiserver.close()
    async with audited.unix_session(GPU) as session:
        response = await session.get(f"{SLICES}?{PINNED}")
    assert response.status == 503
    (event,) = await audited.events()
    assert event["annotations"][DECISION] == "allow"
    assert event["responseStatus"]["code"] == 503


async def test_watch_has_started_and_complete_events(
    audited: Audited, apiserver: APIServer
) -> None:
    async with audited.unix_session(GPU) as session:
        watch = await session.get(f"{SLICES}?{PINNED}&watch=true&timeoutSeconds=1")
        assert watch.status == 200
        seed(apiserver, name="node-a-gpu-0")
        json.loads(await asyncio.wait_for(watch.content.readline(), 5))
        await watch.read()  # the upstream ends the watch after timeoutSeconds
    started, complete = await audited.events()
    assert (started["stage"], complete["stage"]) == ("ResponseStarted", "ResponseComplete")
    assert started["auditID"] == complete["auditID"] == watch.headers["Audit-Id"]
    assert started["verb"] == "watch" and started["annotations"][DECISION] == "allow"
    assert started["stageTimestamp"] <= complete["stageTimestamp"]
    assert "responseObject" not in complete


async def test_client_audit_id_is_a_hint_only(audited: Audited) -> None:
    async with audited.unix_session(GPU) as session:
        first = await session.get("/version", headers={"Audit-ID": "driver-42"})
        second = await session.get("/version", headers={"Audit-ID": "driver-42"})
        forged = await session.get("/version", headers={"Audit-ID": 'x\u00e9 "quoted"'})
    events = await audited.events()
    ids = [event["auditID"] for event in events]
    assert len(set(ids)) == 3 and "driver-42" not in ids
    assert [r.headers["Audit-Id"] for r in (first, second, forged)] == ids
    hints = [event["annotations"].get("dra-gatekeeper.io/client-audit-id") for event in events]
    assert hints == ["driver-42", "driver-42", None]


@pytest.mark.parametrize("audit_level", list(AuditLevel), ids=lambda level: level.value)
async def test_levels_log_bodies_only_where_they_should(
    audited: Audited, audit_level: AuditLevel
) -> None:
    async with audited.unix_session(GPU) as session:
        created = await session.post(SLICES, json=slice_body())
        assert created.status == 201
        discovery = await session.get("/apis/resource.k8s.io/v1")
        assert discovery.status == 200
    create, discover = await audited.events()
    assert ("requestObject" in create) is (audit_level is not AuditLevel.METADATA)
    assert ("responseObject" in create) is (audit_level is AuditLevel.REQUEST_RESPONSE)
    if audit_level is AuditLevel.REQUEST_RESPONSE:
        assert create["responseObject"]["metadata"]["name"] == "node-a-gpu-0"
    assert "requestObject" not in discover and "responseObject" not in discover
    assert create["level"] == audit_level.value


@pytest.mark.parametrize("audit_level", [AuditLevel.REQUEST_RESPONSE], ids=["RequestResponse"])
async def test_no_secrets_in_the_log(audited: Audited, audit_level: AuditLevel) -> None:
    async with audited.unix_session(GPU) as session:
        await session.post(
            SLICES, json=slice_body(), headers={"Authorization": "Bearer driver-secret-token"}
        )
    async with audited.tls_session(GPU) as session:
        await session.get("/version")
    text = audited.log_path.read_text() if await audited.events() else ""
    for secret in ("driver-secret-token", NODE_TOKEN, "BEGIN", "PRIVATE"):
        assert secret not in text


@pytest.mark.parametrize(
    # One driver, 1,000 requests at once: above the per-driver budgets
    # (docs/operating.md#limits), which this test of the audit under load raises.
    "limits",
    [Limits(inflight_per_driver=1000, connections_per_driver=1000)],
    ids=["budgets-raised"],
)
async def test_thousand_concurrent_requests_thousand_events(
    audited: Audited, apiserver: APIServer
) -> None:
    paths = [f"{SLICES}?{PINNED}", SLICES, "/version", f"{SLICES}/node-a-none"]

    async def one(index: int, session: Any) -> str:
        response = await session.get(paths[index % len(paths)])
        await response.read()
        return str(response.headers["Audit-Id"])

    # Half over the Unix socket, half over mTLS, 1,000 requests in flight at once (each client
    # session keeps at most 100 connections: the listen backlog is aiohttp's default 128).
    unix, tls = audited.unix_session(GPU), audited.tls_session(GPU)
    async with unix, tls:
        ids = await asyncio.gather(
            *(one(index, unix if index % 2 else tls) for index in range(1000))
        )
    lines = audited.log_path.read_text().splitlines() if await audited.events() else []
    events = [json.loads(line) for line in lines]
    assert len(events) == 1000
    assert sorted(event["auditID"] for event in events) == sorted(ids)
    decisions = Counter(event["annotations"][DECISION] for event in events)
    assert decisions == {"allow": 500, "forbid": 500}


FORWARDED = "dra-gatekeeper.io/forwarded"


async def test_what_was_forwarded_is_annotated_when_it_differs(audited: Audited) -> None:
    """An apply of a missing object of a kind whose ownership fields may change (DevicePool)
    is sent as a create: the event says so (and a plain create, forwarded as sent, carries no
    such annotation). A ResourceSlice apply-create is forwarded as the apply (owners immutable)."""
    pools = "/apis/devmgmtproto.k8s.io/v1alpha1/devicepools"
    apply = json.dumps(
        {
            "apiVersion": "devmgmtproto.k8s.io/v1alpha1",
            "kind": "DevicePool",
            "metadata": {"name": "node-a"},
            "spec": {"driver": GPU, "nodeName": NODE},
        }
    )
    async with audited.unix_session(GPU) as session:
        applied = await session.patch(
            f"{pools}/node-a?fieldManager=gpu-driver&force=true",
            data=apply,
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        assert applied.status == 201, await applied.text()
        created = await session.post(SLICES, json=slice_body())
        assert created.status == 201
    apply_event, create_event = await audited.events()
    assert apply_event["verb"] == "patch"
    assert apply_event["annotations"][FORWARDED] == f"POST {pools}?fieldManager=gpu-driver"
    assert FORWARDED not in create_event["annotations"]


def _injecting_policy() -> Policy:
    default = resources.files("gatekeeper").joinpath("policies/default.yaml").read_text()
    text = default.replace("listSelector: Require", "listSelector: Inject")
    return parse_policy(text).with_drivers(frozenset({GPU}))


@pytest.mark.parametrize("policy", [_injecting_policy()], ids=["inject"])
async def test_injected_selector_terms_are_annotated(audited: Audited, policy: Policy) -> None:
    async with audited.unix_session(GPU) as session:
        listed = await session.get(f"{SLICES}?fieldSelector=spec.nodeName%3D{NODE}")
        assert listed.status == 200, await listed.text()
    (event,) = await audited.events()
    assert event["annotations"][FORWARDED] == (
        f"GET {SLICES}?fieldSelector=spec.nodeName%3D{NODE}%2Cspec.driver%3D{GPU}"
    )
