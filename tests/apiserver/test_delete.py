"""Delete and deletecollection (``gatekeeper/apiserver/_delete.py``): the options come from the
body when there is one (recordings 149-166), the ``orphan`` finalizer, completing a delete."""

from __future__ import annotations

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer, resource_slice
from tests.apiserver.helpers import MERGE, SLICES, call

GROUP, RESOURCE = "resource.k8s.io", "resourceslices"


def _slice(name: str) -> dict:
    return resource_slice(name, driver="gpu.example.com", node="node-a")


async def test_with_a_body_the_querys_dry_run_is_ignored(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    stored = server.add(_slice("s1"))
    pre = {"preconditions": {"uid": stored["metadata"]["uid"]}}
    status, _ = await call(client, "DELETE", f"{SLICES}/s1?dryRun=All", pre)
    assert status == 200
    assert server.get(GROUP, RESOURCE, "s1") is None  # really deleted, as recording 149


async def test_dry_run_in_the_body_keeps_the_object(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    stored = server.add(_slice("s1"))
    status, body = await call(client, "DELETE", f"{SLICES}/s1", {"dryRun": ["All"]})
    assert status == 200 and body["metadata"] == stored["metadata"]
    assert server.get(GROUP, RESOURCE, "s1") == stored
    status, _ = await call(client, "DELETE", f"{SLICES}/s1?dryRun=All")  # no body: the query
    assert status == 200 and server.get(GROUP, RESOURCE, "s1") == stored


async def test_orphan_from_the_query_marks_and_a_finalizer_patch_completes(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    stored = server.add(_slice("s1"))
    status, body = await call(client, "DELETE", f"{SLICES}/s1?propagationPolicy=Orphan")
    meta = body["metadata"]
    assert status == 200 and meta["finalizers"] == ["orphan"]
    assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 0
    assert meta["generation"] == stored["metadata"]["generation"] + 1
    assert server.get(GROUP, RESOURCE, "s1") is not None  # no garbage collector here
    marked_rv = meta["resourceVersion"]
    status, body = await call(
        client, "PATCH", f"{SLICES}/s1", {"metadata": {"finalizers": None}}, MERGE
    )
    assert status == 200 and body["metadata"]["resourceVersion"] == marked_rv  # recording 159
    assert server.get(GROUP, RESOURCE, "s1") is None


async def test_orphan_in_the_query_is_ignored_with_a_body(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    server.add(_slice("s1"))
    status, _ = await call(client, "DELETE", f"{SLICES}/s1?propagationPolicy=Orphan", {})
    assert status == 200 and server.get(GROUP, RESOURCE, "s1") is None


async def test_orphan_dependents_false_is_answered_202(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    obj = _slice("s1")
    obj["metadata"]["finalizers"] = ["example.com/hold"]
    server.add(obj)
    status, body = await call(client, "DELETE", f"{SLICES}/s1", {"orphanDependents": False})
    assert status == 202 and body["metadata"]["deletionTimestamp"]


@pytest.mark.parametrize(
    ("query", "body"),
    [("", {"dryRun": ["All"]}), ("&dryRun=All", None)],
    ids=["body", "query"],
)
async def test_deletecollection_dry_run_lists_and_keeps(
    client: aiohttp.ClientSession, server: APIServer, query: str, body: dict | None
) -> None:
    for name in ("a", "b"):
        server.add(_slice(name))
    path = f"{SLICES}?fieldSelector=spec.nodeName%3Dnode-a{query}"
    status, listed = await call(client, "DELETE", path, body)
    assert status == 200 and [i["metadata"]["name"] for i in listed["items"]] == ["a", "b"]
    assert [o["metadata"]["name"] for o in server.objects(GROUP, RESOURCE)] == ["a", "b"]


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'"x"',
        b"{",
        b'{"kind":"Pod"}',
        b'{"apiVersion":"apps/v1"}',
        b'{"dryrun":["All"]}',
        b'{"dryRun":["Yes"]}',
        b'{"dryRun":"All"}',
        b'{"propagationPolicy":"Sideways"}',
        b'{"gracePeriodSeconds":"5"}',
        b'{"preconditions":[]}',
    ],
)
async def test_a_delete_body_must_be_delete_options(
    client: aiohttp.ClientSession, server: APIServer, body: bytes
) -> None:
    server.add(_slice("s1"))
    for path in (f"{SLICES}/s1", SLICES):
        status, answer = await call(client, "DELETE", path, raw=body)
        assert status == 400 and answer["kind"] == "Status", (path, answer)
    assert server.get(GROUP, RESOURCE, "s1") is not None


async def test_a_full_delete_options_body_is_accepted(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    server.add(_slice("s1"))
    body = {
        "kind": "DeleteOptions",
        "apiVersion": "meta.k8s.io/v1",
        "gracePeriodSeconds": 0,
        "propagationPolicy": "Background",
    }
    status, _ = await call(client, "DELETE", f"{SLICES}/s1", body)
    assert status == 200 and server.get(GROUP, RESOURCE, "s1") is None
