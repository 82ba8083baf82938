"""A JSON create or update body holding a null, through a real gatekeeper in front of the
embedded API server (docs/security.md, "What the apiserver will store"): decided on the
apiserver's dry run of exactly the bytes then forwarded, under the gatekeeper's credentials;
nothing asked about another driver's object; client-go's ``creationTimestamp: null`` asks
nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer, JournalEntry
from gatekeeper.testing.harness import NODE, NODE_TOKEN, PKI, Running
from tests.proxy.taintrules import RULES, send, taint_rule, taint_rule_stack


@pytest.fixture
async def stack(pki: PKI) -> AsyncIterator[tuple[APIServer, Running]]:
    async with taint_rule_stack(pki) as running:
        yield running


def with_value(name: str, pool: str = f"{NODE}/gpus") -> dict[str, Any]:
    """A DeviceTaintRule of the GPU driver whose taint's value is null."""
    rule = taint_rule(name, pool)
    rule["spec"]["taint"]["value"] = None
    return rule


def writes(apiserver: APIServer, since: int) -> list[JournalEntry]:
    return [e for e in apiserver.journal[since:] if e.method != "GET"]


async def test_a_create_with_a_null_is_asked_then_the_same_bytes_forwarded(
    stack: tuple[APIServer, Running],
) -> None:
    apiserver, gatekeeper = stack
    since = len(apiserver.journal)
    code, created = await send(gatekeeper, "POST", RULES, with_value("new"))
    assert code == 201, created
    dry_run, write = writes(apiserver, since)
    assert (dry_run.method, dry_run.path, dry_run.query_string) == ("POST", RULES, "dryRun=All")
    assert (write.method, write.path, write.query_string) == ("POST", RULES, "")
    assert dry_run.body == write.body
    assert json.loads(write.body)["spec"]["taint"]["value"] is None
    for entry in (dry_run, write):
        assert entry.headers["Authorization"] == f"Bearer {NODE_TOKEN}"  # the gatekeeper's own
    assert created["metadata"]["name"] == "new"


async def test_client_gos_creation_timestamp_null_asks_nothing(
    stack: tuple[APIServer, Running],
) -> None:
    apiserver, gatekeeper = stack
    body = taint_rule("plain", f"{NODE}/gpus")
    body["metadata"]["creationTimestamp"] = None  # what client-go's JSON encoding sends
    since = len(apiserver.journal)
    code, _ = await send(gatekeeper, "POST", RULES, body)
    assert code == 201
    [write] = writes(apiserver, since)
    assert write.query_string == ""


async def test_an_update_of_another_drivers_object_asks_nothing(
    stack: tuple[APIServer, Running],
) -> None:
    apiserver, gatekeeper = stack
    body = with_value("theirs")
    since = len(apiserver.journal)
    code, status = await send(gatekeeper, "PUT", f"{RULES}/theirs", body)
    assert code == 404, status
    assert writes(apiserver, since) == []  # the read of it, and nothing else
    [stored] = [o for o in apiserver.objects("resource.k8s.io", "devicetaintrules")
                if o["metadata"]["name"] == "theirs"]  # fmt: skip
    assert "value" not in stored["spec"]["taint"]
