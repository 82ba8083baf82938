"""The adversarial corpus (tests/corpus/*.yaml): every entry is refused as written there, as a
Status with an Audit-Id and a ``forbid`` audit event where the gatekeeper's handler answers,
and the embedded API server's journal never sees a refused request."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml

from gatekeeper.apiserver import APIServer, resource_slice
from gatekeeper.policy import Policy
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    PKI,
    RecordingSink,
    Running,
    running_gatekeeper,
)
from tests.paths import REPO
from tests.rawhttp import build_request, send_raw_all

CORPUS = REPO / "tests" / "corpus"
_BOMB_LINES = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] + [
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)
]


def _entries() -> list[tuple[str, dict[str, Any]]]:
    entries = []
    for path in sorted(CORPUS.glob("*.yaml")):
        for entry in yaml.safe_load(path.read_text()):
            entries.append((f"{path.stem}/{entry['id']}", entry))
    return entries


ENTRIES = _entries()


def _body(spec: dict[str, Any] | None) -> bytes:
    if spec is None:
        return b""
    if "json" in spec:
        return json.dumps(spec["json"]).encode()
    if "text" in spec:
        return str(spec["text"]).encode()
    if "hex" in spec:
        return bytes.fromhex(spec["hex"])
    generate = spec["generate"]
    name = generate["name"]
    if name == "deep-json":
        depth = generate["depth"]
        return ('{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","spec":'
                + '{"a":' * depth + "1" + "}" * depth + "}").encode()  # fmt: skip
    if name == "deep-yaml":
        depth = generate["depth"]
        return ("apiVersion: resource.k8s.io/v1\nspec: " + "[" * depth + "]" * depth).encode()
    if name == "alias-bomb":
        return "\n".join(_BOMB_LINES).encode()
    if name == "large":
        size = generate["size"]
        return b'{"a":"' + b"x" * size + b'"}'
    raise AssertionError(f"unknown generator {name}")


def _request_bytes(entry: dict[str, Any]) -> bytes:
    if "raw" in entry:
        return str(entry["raw"]).encode("latin-1")
    if "raw_repeat" in entry:
        spec = entry["raw_repeat"]
        return (spec["prefix"] + spec["repeat"] * spec["times"] + spec["suffix"]).encode()
    body = _body(entry.get("body"))
    headers = dict(entry.get("headers", {}))
    if body and not any(name.lower() == "content-type" for name in headers):
        headers["Content-Type"] = "application/json"
    return build_request(entry["method"], entry["target"], headers, body)


def _audit_id(headers: dict[str, str]) -> str:
    """The Audit-ID the gatekeeper forwarded (header names as received, any case)."""
    return next((v for k, v in headers.items() if k.lower() == "audit-id"), "")


@pytest.fixture
async def stack(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> AsyncIterator[tuple[Running, RecordingSink]]:
    apiserver.add(resource_slice("node-a-gpu", driver=GPU, node=NODE, pool=NODE))
    apiserver.add(resource_slice("node-a-nic", driver=NIC, node=NODE, pool=NODE))
    sink = RecordingSink()
    async with running_gatekeeper(apiserver, policy, pki, audit_sink=sink) as running:
        yield running, sink


@pytest.mark.parametrize("entry", [e for _, e in ENTRIES], ids=[i for i, _ in ENTRIES])
async def test_corpus_entry_is_refused_and_never_reaches_the_apiserver(
    entry: dict[str, Any], stack: tuple[Running, RecordingSink], apiserver: APIServer
) -> None:
    running, sink = stack
    before = len(apiserver.journal)
    responses = await send_raw_all(running.socket_path(GPU), _request_bytes(entry))
    expect = entry["expect"]
    statuses = expect.get("status", [expect.get("code")])
    assert [r.status for r in responses] == statuses, [r.raw[:300] for r in responses]
    refused_ids = []
    for response in responses:
        if response.status < 400:
            continue
        status = response.json()
        if "message" in expect:
            assert status is not None and status.get("kind") == "Status", response.body[:300]
            assert re.search(expect["message"], status["message"]), status["message"]
        if expect.get("json") or "message" in expect:
            assert response.headers["content-type"].startswith("application/json")
            audit_id = response.headers["audit-id"]
            refused_ids.append(audit_id)
            (event,) = sink.by_id(audit_id)
            assert event["responseStatus"]["code"] == response.status
            assert event["annotations"]["authorization.k8s.io/decision"] == "forbid"
    new = apiserver.journal[before:]
    allowed = entry.get("allowed", 0)
    if entry.get("fetches"):
        # Only the gatekeeper's own read of the stored object, never the refused request.
        assert all(e.method == "GET" for e in new), [(e.method, e.path) for e in new]
    else:
        assert len(new) == allowed, [(e.method, e.path) for e in new]
    forwarded_ids = {_audit_id(e.headers) for e in new}
    assert not forwarded_ids & set(refused_ids)


def test_the_corpus_covers_every_category() -> None:
    categories = {entry_id.split("/")[0] for entry_id, _ in ENTRIES}
    assert categories == {"bodies", "framing", "headers", "methods", "paths", "queries"}
    assert len({entry_id for entry_id, _ in ENTRIES}) == len(ENTRIES)
