"""A JSON create or update body holding a null, through a real gatekeeper in front of the
embedded API server (docs/security.md, "What the apiserver will store"): decided on the
apiserver's dry run of exactly the bytes then forwarded, under the gatekeeper's credentials;
nothing asked about another driver's object; client-go's ``creationTimestamp: null`` asks
nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer, JournalEntry
from gatekeeper.cli.served import served_kinds
from gatekeeper.policyfile import load_policy
from gatekeeper.testing.harness import GPU, NODE, NODE_TOKEN, PKI, Running, running_gatekeeper

POLICY = Path(__file__).parents[1] / "corpus" / "patches" / "policy.yaml"
RULES = "/apis/resource.k8s.io/v1beta2/devicetaintrules"


def taint_rule(name: str, driver: str = GPU, **taint: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": driver, "pool": f"{NODE}/gpus"},
            "taint": {"key": "gpu.example.com/unhealthy", "effect": "NoSchedule", **taint},
        },
    }


@pytest.fixture
async def stack(pki: PKI) -> AsyncIterator[tuple[APIServer, Running]]:
    policy = load_policy(str(POLICY))
    apiserver = APIServer(served_kinds(policy), token=NODE_TOKEN)
    await apiserver.start()
    try:
        apiserver.add(taint_rule("theirs", driver="nic.example.com"))
        async with running_gatekeeper(apiserver, policy, pki) as gatekeeper:
            yield apiserver, gatekeeper
    finally:
        await apiserver.close()


async def send(running: Running, method: str, path: str, body: Any) -> tuple[int, Any]:
    connector = aiohttp.UnixConnector(path=str(running.socket_path(GPU)))
    async with (
        aiohttp.ClientSession("http://localhost", connector=connector) as session,
        session.request(
            method, path, data=json.dumps(body), headers={"Content-Type": "application/json"}
        ) as answer,  # fmt: skip
    ):
        return answer.status, await answer.json()


def writes(apiserver: APIServer, since: int) -> list[JournalEntry]:
    return [e for e in apiserver.journal[since:] if e.method != "GET"]


async def test_a_create_with_a_null_is_asked_then_the_same_bytes_forwarded(
    stack: tuple[APIServer, Running],
) -> None:
    apiserver, gatekeeper = stack
    since = len(apiserver.journal)
    code, created = await send(gatekeeper, "POST", RULES, taint_rule("mine", value=None))
    assert code == 201, created
    dry_run, write = writes(apiserver, since)
    assert (dry_run.method, dry_run.path, dry_run.query_string) == ("POST", RULES, "dryRun=All")
    assert (write.method, write.path, write.query_string) == ("POST", RULES, "")
    assert dry_run.body == write.body
    assert json.loads(write.body)["spec"]["taint"]["value"] is None
    for entry in (dry_run, write):
        assert entry.headers["Authorization"] == f"Bearer {NODE_TOKEN}"  # the gatekeeper's own
    assert created["metadata"]["name"] == "mine"


async def test_client_gos_creation_timestamp_null_asks_nothing(
    stack: tuple[APIServer, Running],
) -> None:
    apiserver, gatekeeper = stack
    body = taint_rule("plain")
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
    body = taint_rule("theirs", value=None)
    since = len(apiserver.journal)
    code, status = await send(gatekeeper, "PUT", f"{RULES}/theirs", body)
    assert code == 404, status
    assert writes(apiserver, since) == []  # the read of it, and nothing else
    [stored] = [o for o in apiserver.objects("resource.k8s.io", "devicetaintrules")
                if o["metadata"]["name"] == "theirs"]  # fmt: skip
    assert "value" not in stored["spec"]["taint"]
