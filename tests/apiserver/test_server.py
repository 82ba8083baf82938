"""The embedded API server over real HTTP on loopback: CRUD, lists, watches, discovery, auth."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

import gatekeeper.apiserver as apiserver_pkg
from gatekeeper.apiserver import DRA_KINDS, APIServer, ServedKind, running_api_server
from tests.apiserver.helpers import CLAIMS, MERGE, SLICES, call

# Must match tests/apiserver/conftest.py (conftest modules are not importable by name).
KINDS: tuple[ServedKind, ...] = (*DRA_KINDS, ServedKind("", "nodes", "Node", False, ("v1",)))
TOKEN = "test-token"
TLSFiles = Any  # the conftest's TLSFiles: ca, server_cert/key, client_cert/key, other_client_*

JSON_PATCH = {"Content-Type": "application/json-patch+json"}
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"


def a_slice(
    name: str,
    node: str = "node-a",
    driver: str = "gpu.example.com",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": f"{node}-pool", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


def a_claim(name: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
    }
    if status is not None:
        claim["status"] = status
    return claim


# --- package surface ---------------------------------------------------------------------------


def test_exported_members() -> None:
    for name in apiserver_pkg.__all__:
        assert hasattr(apiserver_pkg, name), name
    assert {"APIServer", "ServedKind", "JournalEntry", "running_api_server"} <= set(
        apiserver_pkg.__all__
    )


async def test_listens_on_loopback_only() -> None:
    api = APIServer(KINDS)
    with pytest.raises(ValueError, match="loopback"):
        await api.start("0.0.0.0")


async def test_app_runs_under_aiohttp_test_server() -> None:
    api = APIServer(KINDS)
    async with (
        TestServer(api.app) as ts,
        aiohttp.ClientSession() as session,
        session.get(ts.make_url("/version")) as resp,
    ):
        assert resp.status == 200
        assert (await resp.json())["major"] == "1"


# --- create / get ------------------------------------------------------------------------------


async def test_create_assigns_system_metadata_and_get_returns_it(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    status, created = await call(client, "POST", SLICES, a_slice("s1"))
    assert status == 201
    meta = created["metadata"]
    assert list(created)[:2] == ["kind", "apiVersion"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    assert (await call(client, "GET", f"{SLICES}/s1"))[1] == created
    assert server.get("resource.k8s.io", "resourceslices", "s1") == created


async def test_create_errors_match_the_apiserver(client: aiohttp.ClientSession) -> None:
    await call(client, "POST", SLICES, a_slice("s1"))
    status, body = await call(client, "POST", SLICES, a_slice("s1"))
    assert (status, body["reason"]) == (409, "AlreadyExists")
    assert body["message"] == 'resourceslices.resource.k8s.io "s1" already exists'
    status, body = await call(
        client, "POST", SLICES, raw=b'{"apiVersion": "resource.k8s.io/v1", "kind": '
    )
    assert (status, body["reason"]) == (400, "BadRequest")
    assert body["message"].startswith(
        "the object provided is unrecognized (must be of type "
        "ResourceSlice): couldn't get version/kind; json parse error"
    )
    wrong = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"}}
    status, body = await call(client, "POST", SLICES, wrong)
    assert status == 400
    assert body["message"] == (
        'DeviceClass in version "v1" cannot be handled as a ResourceSlice: '
        "converting (v1.DeviceClass) to (resource.ResourceSlice): unknown "
        "conversion"
    )
    status, body = await call(
        client, "POST", SLICES, raw=b"x", headers={"Content-Type": "text/plain"}
    )
    assert (status, body["reason"]) == (415, "UnsupportedMediaType")


async def test_generate_name_uses_the_apiserver_alphabet(client: aiohttp.ClientSession) -> None:
    obj = a_slice("")
    obj["metadata"] = {"generateName": "node-a-gpu-"}
    status, created = await call(client, "POST", SLICES, obj)
    assert status == 201
    name = created["metadata"]["name"]
    assert name.startswith("node-a-gpu-") and len(name) == len("node-a-gpu-") + 5
    assert set(name[-5:]) <= set("bcdfghjklmnpqrstvwxz2456789")


async def test_dry_run_create_persists_nothing(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    status, body = await call(client, "POST", f"{SLICES}?dryRun=All", a_slice("dry"))
    assert status == 201 and "resourceVersion" not in body["metadata"]
    assert body["metadata"]["uid"]
    assert server.get("resource.k8s.io", "resourceslices", "dry") is None


async def test_not_found_messages(client: aiohttp.ClientSession) -> None:
    status, body = await call(client, "GET", f"{SLICES}/nope")
    assert (status, body["message"]) == (404, 'resourceslices.resource.k8s.io "nope" not found')
    assert body["details"] == {"name": "nope", "group": "resource.k8s.io", "kind": "resourceslices"}
    for path in (
        "/apis/resource.k8s.io/v9/resourceslices",
        "/apis/other.io/v1/things",
        "/api/v1/secrets",
        "/nonsense",
        "/apis/resource.k8s.io/v1/namespaces/x/resourceslices",
    ):
        status, body = await call(client, "GET", path)
        assert status == 404, path
        assert body["message"] == "the server could not find the requested resource"


async def test_reading_through_another_version_rewrites_only_api_version(
    client: aiohttp.ClientSession,
) -> None:
    _, created = await call(client, "POST", SLICES, a_slice("s1"))
    _, beta = await call(client, "GET", "/apis/resource.k8s.io/v1beta1/resourceslices/s1")
    assert beta["apiVersion"] == "resource.k8s.io/v1beta1"
    assert {**beta, "apiVersion": created["apiVersion"]} == created


# --- update ------------------------------------------------------------------------------------


async def test_update_preconditions_and_generation(client: aiohttp.ClientSession) -> None:
    _, created = await call(client, "POST", SLICES, a_slice("s1"))
    body = json.loads(json.dumps(created))
    body["metadata"]["labels"] = {"x": "y"}
    status, updated = await call(client, "PUT", f"{SLICES}/s1", body)
    assert status == 200 and updated["metadata"]["generation"] == 1  # metadata only
    assert int(updated["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    status, conflict = await call(client, "PUT", f"{SLICES}/s1", body)  # stale rv
    assert (status, conflict["reason"]) == (409, "Conflict")
    assert conflict["message"] == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "s1": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )
    body["metadata"]["resourceVersion"] = ""
    body["spec"]["devices"].append({"name": "gpu-1"})
    status, updated = await call(client, "PUT", f"{SLICES}/s1", body)  # unconditional
    assert status == 200 and updated["metadata"]["generation"] == 2
    same_rv = updated["metadata"]["resourceVersion"]
    status, noop = await call(client, "PUT", f"{SLICES}/s1", updated)
    assert status == 200 and noop["metadata"]["resourceVersion"] == same_rv  # no-op: no write
    body["metadata"]["name"] = "other-name"
    status, mismatch = await call(client, "PUT", f"{SLICES}/s1", body)
    assert status == 400 and mismatch["message"] == (
        "the name of the object (other-name) does not match the name on the URL (s1)"
    )
    status, _ = await call(client, "PUT", f"{SLICES}/missing", a_slice("missing"))
    assert status == 404


async def test_immutable_field_is_422(client: aiohttp.ClientSession) -> None:
    _, created = await call(client, "POST", SLICES, a_slice("s1"))
    created["spec"]["nodeName"] = "node-b"
    status, body = await call(client, "PUT", f"{SLICES}/s1", created)
    assert (status, body["reason"]) == (422, "Invalid")
    assert body["message"] == (
        'ResourceSlice.resource.k8s.io "s1" is invalid: spec.nodeName: '
        'Invalid value: "node-b": field is immutable'
    )
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "spec.nodeName",
            "message": 'Invalid value: "node-b": field is immutable',
        }
    ]


# --- patch -------------------------------------------------------------------------------------


async def test_patch_types(client: aiohttp.ClientSession) -> None:
    await call(client, "POST", SLICES, a_slice("s1"))
    status, body = await call(
        client, "PATCH", f"{SLICES}/s1", {"metadata": {"labels": {"patched": "merge"}}}, MERGE
    )
    assert status == 200 and body["metadata"]["labels"] == {"patched": "merge"}
    ops = [{"op": "add", "path": "/spec/devices/-", "value": {"name": "gpu-1"}}]
    status, body = await call(client, "PATCH", f"{SLICES}/s1", ops, JSON_PATCH)
    assert status == 200 and len(body["spec"]["devices"]) == 2
    assert body["metadata"]["generation"] == 2
    # Strategic merge is applied as a merge patch: lists are replaced (documented difference).
    smp = {"spec": {"devices": [{"name": "only"}]}}
    status, body = await call(
        client,
        "PATCH",
        f"{SLICES}/s1",
        smp,
        {"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert status == 200 and body["spec"]["devices"] == [{"name": "only"}]
    failing = [
        {"op": "test", "path": "/spec/nodeName", "value": "node-z"},
        {"op": "replace", "path": "/spec/nodeName", "value": "node-b"},
    ]
    status, body = await call(client, "PATCH", f"{SLICES}/s1", failing, JSON_PATCH)
    assert (status, body["message"]) == (
        422,
        "the server rejected our request due to an error in our request",
    )
    status, body = await call(
        client,
        "PATCH",
        f"{SLICES}/s1",
        {"metadata": {"resourceVersion": "77", "labels": {"x": "y"}}},
        MERGE,
    )
    assert (status, body["reason"]) == (409, "Conflict")
    status, body = await call(
        client, "PATCH", f"{SLICES}/s1", {"a": 1}, {"Content-Type": "text/plain"}
    )
    assert (status, body["message"], body["details"]) == (415, "415: Unsupported Media Type", {})
    status, body = await call(client, "PATCH", f"{SLICES}/nope", {"a": 1}, MERGE)
    assert status == 404
    status, body = await call(client, "PATCH", f"{SLICES}/s1", {"spec": {"driver": "x.io"}}, MERGE)
    assert (
        status == 422
        and 'spec.driver: Invalid value: "x.io": field is immutable' in body["message"]
    )


async def test_dry_run_patch_returns_the_would_be_object_with_the_old_rv(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    _, created = await call(client, "POST", SLICES, a_slice("s1"))
    status, body = await call(
        client, "PATCH", f"{SLICES}/s1?dryRun=All", {"metadata": {"labels": {"dry": "yes"}}}, MERGE
    )
    assert status == 200 and body["metadata"]["labels"] == {"dry": "yes"}
    assert body["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert server.get("resource.k8s.io", "resourceslices", "s1") == created


async def test_server_side_apply_creates_and_merges(client: aiohttp.ClientSession) -> None:
    apply = {"Content-Type": "application/apply-patch+yaml"}
    config = a_slice("ssa")
    config["metadata"]["resourceVersion"] = "999"  # ignored on create, as the apiserver does
    status, body = await call(client, "PATCH", f"{SLICES}/ssa?fieldManager=t", config, apply)
    assert status == 201 and body["metadata"]["name"] == "ssa"
    yaml_body = (
        b"apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: ssa\n"
        b"  labels: {ssa: applied}\n"
    )
    # Another manager's apply: the fields manager "t" applied stay (the same manager leaving
    # them out of its configuration would remove them, as real server-side apply does).
    status, body = await call(
        client, "PATCH", f"{SLICES}/ssa?fieldManager=u", raw=yaml_body, headers=apply
    )
    assert status == 200 and body["metadata"]["labels"] == {"ssa": "applied"}
    assert body["spec"]["nodeName"] == "node-a"  # merged, not replaced
    status, body = await call(client, "PATCH", f"{SLICES}/ssa", config, apply)
    assert status == 422 and "fieldManager: Required value" in body["message"]
    stale = {**a_slice("ssa"), "metadata": {"name": "ssa", "resourceVersion": "77"}}
    status, body = await call(client, "PATCH", f"{SLICES}/ssa?fieldManager=t", stale, apply)
    assert status == 409


# --- status subresource ------------------------------------------------------------------------


async def test_status_subresource_splits_writes(client: aiohttp.ClientSession) -> None:
    status, created = await call(client, "POST", CLAIMS, a_claim("c1", {"allocation": {"x": 1}}))
    # create resets status; a ResourceClaim's is then written empty, as the apiserver does
    assert status == 201 and created["status"] == {}
    created["status"] = {"allocation": {"devices": {"results": []}}}
    created["metadata"]["labels"] = {"ignored": "on-status"}
    status, body = await call(client, "PUT", f"{CLAIMS}/c1/status", created)
    assert status == 200 and body["status"] == created["status"]
    assert "labels" not in body["metadata"]  # only .status changes through /status
    body["status"] = {"changed": "through-main"}
    body["metadata"]["labels"] = {"main": "put"}
    status, main = await call(client, "PUT", f"{CLAIMS}/c1", body)
    assert status == 200 and main["status"] == created["status"]  # kept (recording 140)
    assert main["metadata"]["labels"] == {"main": "put"}
    status, patched = await call(
        client, "PATCH", f"{CLAIMS}/c1/status", {"status": {"reservedFor": [{"name": "p"}]}}, MERGE
    )
    assert status == 200 and patched["status"]["reservedFor"] == [{"name": "p"}]
    status, _ = await call(client, "DELETE", f"{CLAIMS}/c1/status")
    assert status == 405


# --- delete ------------------------------------------------------------------------------------


async def test_delete_preconditions_dry_run_and_result(client: aiohttp.ClientSession) -> None:
    _, created = await call(client, "POST", SLICES, a_slice("s1"))
    rv = created["metadata"]["resourceVersion"]
    stale = {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"resourceVersion": "77"},
    }
    status, body = await call(client, "DELETE", f"{SLICES}/s1", stale)
    assert status == 409 and body["message"] == (
        'Operation cannot be fulfilled on ResourceSlice.resource.k8s.io "s1": the ResourceVersion '
        f"in the precondition (77) does not match the ResourceVersion in record ({rv}). The object "
        "might have been modified"
    )
    status, body = await call(client, "DELETE", f"{SLICES}/s1", {"preconditions": {"uid": "x"}})
    assert status == 409 and "Precondition failed: UID in precondition: x" in body["message"]
    status, body = await call(client, "DELETE", f"{SLICES}/s1?dryRun=All")
    assert status == 200 and body == created
    good = {"preconditions": {"uid": created["metadata"]["uid"], "resourceVersion": rv}}
    status, body = await call(client, "DELETE", f"{SLICES}/s1", good)
    assert status == 200 and body["metadata"]["name"] == "s1"
    assert int(body["metadata"]["resourceVersion"]) > int(rv)  # the deletion's rv
    assert (await call(client, "DELETE", f"{SLICES}/s1"))[0] == 404


async def test_finalizers_delay_deletion(client: aiohttp.ClientSession, server: APIServer) -> None:
    obj = a_slice("s1")
    obj["metadata"]["finalizers"] = ["example.com/hold"]
    await call(client, "POST", SLICES, obj)
    status, body = await call(client, "DELETE", f"{SLICES}/s1")
    # 200, not 202: the apiserver answers 202 only for orphanDependents=false (recording 157)
    assert status == 200 and body["metadata"]["deletionTimestamp"]
    body["metadata"]["finalizers"] = []
    status, _ = await call(client, "PUT", f"{SLICES}/s1", body)
    assert status == 200
    assert server.get("resource.k8s.io", "resourceslices", "s1") is None


async def test_deletecollection_honours_selectors(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    for name, node in (("a1", "node-a"), ("a2", "node-a"), ("b1", "node-b")):
        await call(client, "POST", SLICES, a_slice(name, node))
    status, body = await call(client, "DELETE", f"{SLICES}?fieldSelector=spec.nodeName%3Dnode-a")
    assert status == 200 and body["kind"] == "ResourceSliceList"
    assert [i["metadata"]["name"] for i in body["items"]] == ["a1", "a2"]
    assert [o["metadata"]["name"] for o in server.objects("resource.k8s.io", "resourceslices")] == [
        "b1"
    ]


# --- list --------------------------------------------------------------------------------------


async def _names(client: aiohttp.ClientSession, query: str) -> list[str]:
    status, body = await call(client, "GET", f"{SLICES}?{query}")
    assert status == 200, body
    return [item["metadata"]["name"] for item in body["items"]]


async def test_field_and_label_selectors(client: aiohttp.ClientSession) -> None:
    await call(client, "POST", SLICES, a_slice("a-gpu", "node-a", labels={"kind": "generated"}))
    await call(client, "POST", SLICES, a_slice("a-nic", "node-a", "nic.example.com"))
    await call(client, "POST", SLICES, a_slice("b-gpu", "node-b"))
    assert await _names(client, "fieldSelector=spec.nodeName%3Dnode-a") == ["a-gpu", "a-nic"]
    assert await _names(
        client, "fieldSelector=spec.nodeName%3D%3Dnode-a,spec.driver%3Dgpu.example.com"
    ) == ["a-gpu"]
    assert await _names(client, "fieldSelector=spec.nodeName%21%3Dnode-a") == ["b-gpu"]
    assert await _names(client, "fieldSelector=metadata.name%3Db-gpu") == ["b-gpu"]
    assert await _names(client, "labelSelector=kind%3Dgenerated") == ["a-gpu"]
    assert await _names(client, "labelSelector=!kind") == ["a-nic", "b-gpu"]
    status, body = await call(client, "GET", f"{SLICES}?fieldSelector=spec.pool.name%3Dx")
    assert (status, body["message"]) == (
        400,
        "field label not supported for resource.k8s.io/v1, Kind=ResourceSlice: spec.pool.name",
    )
    status, body = await call(
        client, "GET", "/apis/resource.k8s.io/v1/resourceclaims?fieldSelector=status.allocation%3Dx"
    )
    assert (status, body["message"]) == (
        400,
        '"status.allocation" is not a known field selector: '
        'only "metadata.name", "metadata.namespace"',
    )
    assert (await call(client, "GET", f"{SLICES}?fieldSelector=spec.nodeName"))[0] == 400
    assert (await call(client, "GET", f"{SLICES}?labelSelector=a%20in%20(b"))[0] == 400
    # apimachinery reads "()" as the set {""} (labels.Parser.parseValues): valid, no match here
    assert await _names(client, "labelSelector=a%20in%20()") == []


async def test_list_items_and_namespaces(client: aiohttp.ClientSession, server: APIServer) -> None:
    server.add(a_claim("c1"))
    other = a_claim("c2")
    other["metadata"]["namespace"] = "other"
    server.add(other)
    _, body = await call(client, "GET", CLAIMS)
    assert body["kind"] == "ResourceClaimList" and body["apiVersion"] == "resource.k8s.io/v1"
    assert [i["metadata"]["name"] for i in body["items"]] == ["c1"]
    assert "kind" not in body["items"][0] and "apiVersion" not in body["items"][0]
    _, body = await call(client, "GET", "/apis/resource.k8s.io/v1/resourceclaims")
    assert [i["metadata"]["namespace"] for i in body["items"]] == ["default", "other"]
    _, body = await call(
        client,
        "GET",
        "/apis/resource.k8s.io/v1/resourceclaims?fieldSelector=metadata.namespace%3Dother",
    )
    assert [i["metadata"]["name"] for i in body["items"]] == ["c2"]


async def test_limit_and_continue(client: aiohttp.ClientSession, server: APIServer) -> None:
    for name in ("s1", "s2", "s3"):
        await call(client, "POST", SLICES, a_slice(name))
    _, page1 = await call(client, "GET", f"{SLICES}?limit=1")
    meta = page1["metadata"]
    assert [i["metadata"]["name"] for i in page1["items"]] == ["s1"]
    assert meta["remainingItemCount"] == 2
    token = json.loads(base64.urlsafe_b64decode(meta["continue"] + "=="))
    assert token == {"v": "meta.k8s.io/v1", "rv": int(meta["resourceVersion"]), "start": "/s1\x00"}
    await call(client, "POST", SLICES, a_slice("s0-later"))  # not in the consistent snapshot
    _, page2 = await call(client, "GET", f"{SLICES}?limit=5&continue={meta['continue']}")
    assert [i["metadata"]["name"] for i in page2["items"]] == ["s2", "s3"]
    assert page2["metadata"]["resourceVersion"] == meta["resourceVersion"]
    assert "continue" not in page2["metadata"]
    server.compact()
    status, gone = await call(client, "GET", f"{SLICES}?limit=1&continue={meta['continue']}")
    assert (status, gone["reason"]) == (410, "Expired")
    assert gone["message"].startswith("The provided continue parameter is too old")
    assert gone["metadata"]["continue"]
    assert (await call(client, "GET", f"{SLICES}?continue=garbage"))[0] == 400


async def test_resource_version_rules(client: aiohttp.ClientSession, server: APIServer) -> None:
    _, first = await call(client, "POST", SLICES, a_slice("s1"))
    rv1 = first["metadata"]["resourceVersion"]
    await call(client, "POST", SLICES, a_slice("s2"))
    _, exact = await call(
        client, "GET", f"{SLICES}?resourceVersion={rv1}&resourceVersionMatch=Exact"
    )
    assert exact["metadata"]["resourceVersion"] == rv1
    assert [i["metadata"]["name"] for i in exact["items"]] == ["s1"]
    assert len((await call(client, "GET", f"{SLICES}?resourceVersion=0"))[1]["items"]) == 2
    status, body = await call(
        client, "GET", f"{SLICES}?resourceVersion=999999&resourceVersionMatch=NotOlderThan"
    )
    assert (status, body["reason"]) == (504, "Timeout")
    assert body["message"].startswith("Timeout: Too large resource version: 999999, current: ")
    assert body["details"]["retryAfterSeconds"] == 1
    server.compact()
    status, body = await call(
        client, "GET", f"{SLICES}?resourceVersion={rv1}&resourceVersionMatch=Exact"
    )
    assert (status, body["message"]) == (
        410,
        "The resourceVersion for the provided list is too old.",
    )


# --- watch -------------------------------------------------------------------------------------


class Watch:
    """Reads a watch stream line by line, as events arrive."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self, timeout: float = 2.0) -> dict[str, Any]:
        line = await asyncio.wait_for(self.resp.content.readline(), timeout)
        assert line.endswith(b"\n"), line
        return json.loads(line)

    async def next_not_bookmark(self) -> dict[str, Any]:
        for _ in range(20):
            event = await self.next()
            if event["type"] != "BOOKMARK":
                return event
        raise AssertionError("only bookmarks")


async def _open_watch(
    client: aiohttp.ClientSession, query: str, path: str = SLICES
) -> aiohttp.ClientResponse:
    resp = await client.get(f"{path}?watch=true&{query}")
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.headers["Transfer-Encoding"] == "chunked"
    return resp


async def test_watch_streams_events_as_they_happen(client: aiohttp.ClientSession) -> None:
    async with await _open_watch(client, "timeoutSeconds=10") as resp:
        watch = Watch(resp)
        for step in range(3):  # each event arrives before the next write is made
            await call(client, "POST", SLICES, a_slice(f"s{step}"))
            event = await watch.next()
            assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", f"s{step}")
            assert event["object"]["kind"] == "ResourceSlice"
        await call(client, "PATCH", f"{SLICES}/s0", {"metadata": {"labels": {"a": "b"}}}, MERGE)
        assert (await watch.next())["type"] == "MODIFIED"
        _, deleted = await call(client, "DELETE", f"{SLICES}/s0")
        event = await watch.next()
        assert event["type"] == "DELETED"
        assert (
            event["object"]["metadata"]["resourceVersion"] == deleted["metadata"]["resourceVersion"]
        )


async def test_watch_initial_state_and_replay(client: aiohttp.ClientSession) -> None:
    _, first = await call(client, "POST", SLICES, a_slice("b"))
    await call(client, "POST", SLICES, a_slice("a"))
    async with await _open_watch(client, "resourceVersion=0&timeoutSeconds=1") as resp:
        watch = Watch(resp)
        names = [(await watch.next())["object"]["metadata"]["name"] for _ in range(2)]
        assert names == ["a", "b"]  # synthetic ADDED in key order
    rv = first["metadata"]["resourceVersion"]
    async with await _open_watch(client, f"resourceVersion={rv}&timeoutSeconds=1") as resp:
        event = await Watch(resp).next()
        assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "a")


async def test_watch_from_compacted_rv_is_one_error_event(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    _, first = await call(client, "POST", SLICES, a_slice("s1"))
    await call(client, "POST", SLICES, a_slice("s2"))
    server.compact()
    rv = first["metadata"]["resourceVersion"]
    async with await _open_watch(client, f"resourceVersion={rv}") as resp:
        lines = (await asyncio.wait_for(resp.read(), 2)).splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"
    assert event["object"]["message"].startswith(f"too old resource version: {rv} (")


async def test_watch_send_initial_events_ends_with_annotated_bookmark(
    client: aiohttp.ClientSession,
) -> None:
    await call(client, "POST", SLICES, a_slice("s1"))
    query = (
        "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        "&timeoutSeconds=1"
    )
    async with await _open_watch(client, query) as resp:
        watch = Watch(resp)
        assert (await watch.next())["type"] == "ADDED"
        bookmark = await watch.next()
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert bookmark["object"]["kind"] == "ResourceSlice"


async def test_watch_bookmarks_and_timeout(client: aiohttp.ClientSession) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with await _open_watch(client, "allowWatchBookmarks=true&timeoutSeconds=1") as resp:
        body = await asyncio.wait_for(resp.read(), 3)
    assert 0.9 <= loop.time() - started < 2.5
    events = [json.loads(line) for line in body.splitlines()]
    assert events and all(e["type"] == "BOOKMARK" for e in events)


async def test_watch_selector_leave_and_enter(client: aiohttp.ClientSession) -> None:
    await call(client, "POST", SLICES, a_slice("s1", labels={"team": "a"}))
    async with await _open_watch(client, "labelSelector=team%3Da&timeoutSeconds=10") as resp:
        watch = Watch(resp)
        assert (await watch.next())["type"] == "ADDED"
        await call(client, "PATCH", f"{SLICES}/s1", {"metadata": {"labels": {"team": "b"}}}, MERGE)
        left = await watch.next()
        assert left["type"] == "DELETED"
        assert left["object"]["metadata"]["labels"] == {"team": "a"}  # previous state, new rv
        await call(client, "PATCH", f"{SLICES}/s1", {"metadata": {"labels": {"x": "1"}}}, MERGE)
        await call(client, "PATCH", f"{SLICES}/s1", {"metadata": {"labels": {"team": "a"}}}, MERGE)
        entered = await watch.next()  # the change while outside the selector is not seen
        assert entered["type"] == "ADDED"
        assert entered["object"]["metadata"]["labels"] == {"team": "a", "x": "1"}


async def test_watch_field_selector_and_namespace(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    async with await _open_watch(
        client, "fieldSelector=spec.nodeName%3Dnode-a&timeoutSeconds=10"
    ) as resp:
        await call(client, "POST", SLICES, a_slice("b", "node-b"))
        await call(client, "POST", SLICES, a_slice("a", "node-a"))
        event = await Watch(resp).next()
        assert event["object"]["metadata"]["name"] == "a"
    async with await _open_watch(client, "timeoutSeconds=10", CLAIMS) as resp:
        other = a_claim("elsewhere")
        other["metadata"]["namespace"] = "other"
        server.add(other)
        server.add(a_claim("here"))
        event = await Watch(resp).next()
        assert event["object"]["metadata"]["name"] == "here"


async def test_watch_disconnect_releases_the_watcher(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    resp = await _open_watch(client, "timeoutSeconds=60")
    await asyncio.sleep(0.1)
    assert server.store.watcher_count == 1
    resp.close()
    for _ in range(40):
        if server.store.watcher_count == 0:
            break
        await asyncio.sleep(0.05)
    assert server.store.watcher_count == 0


async def test_close_ends_watches_promptly() -> None:
    api = APIServer(KINDS)
    await api.start()
    async with aiohttp.ClientSession(base_url=api.url) as session:
        resp = await _open_watch(session, "")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await api.close()
        await asyncio.wait_for(resp.read(), 3)
        assert loop.time() - started < 3
        assert api.store.watcher_count == 0


# --- negotiation -------------------------------------------------------------------------------


async def test_table_and_partial_object_metadata(client: aiohttp.ClientSession) -> None:
    await call(client, "POST", SLICES, a_slice("s1"))
    _, table = await call(client, "GET", SLICES, headers={"Accept": TABLE})
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]] == [
        "Name",
        "Node",
        "Driver",
        "Pool",
        "Age",
    ]
    row = table["rows"][0]
    assert row["cells"][:4] == ["s1", "node-a", "gpu.example.com", "node-a-pool"]
    assert row["object"]["kind"] == "PartialObjectMetadata" and "spec" not in row["object"]
    _, one = await call(client, "GET", f"{SLICES}/s1", headers={"Accept": TABLE})
    assert one["kind"] == "Table" and len(one["rows"]) == 1
    _, partial = await call(client, "GET", SLICES, headers={"Accept": PARTIAL_LIST})
    assert partial["kind"] == "PartialObjectMetadataList"
    assert partial["items"][0]["metadata"]["name"] == "s1"
    status, body = await call(
        client, "GET", SLICES, headers={"Accept": "application/vnd.kubernetes.protobuf"}
    )
    assert (status, body["reason"]) == (406, "NotAcceptable")
    status, body = await call(
        client,
        "GET",
        SLICES,
        headers={"Accept": "application/vnd.kubernetes.protobuf, application/json"},
    )
    assert status == 200 and body["kind"] == "ResourceSliceList"


# --- discovery ---------------------------------------------------------------------------------


async def test_discovery_documents(client: aiohttp.ClientSession) -> None:
    _, version = await call(client, "GET", "/version")
    assert (version["major"], version["minor"]) == ("1", "36")
    _, groups = await call(client, "GET", "/apis")
    resource = next(g for g in groups["groups"] if g["name"] == "resource.k8s.io")
    assert resource["preferredVersion"] == {"groupVersion": "resource.k8s.io/v1", "version": "v1"}
    _, group = await call(client, "GET", "/apis/resource.k8s.io")
    assert group["kind"] == "APIGroup"
    _, resources = await call(client, "GET", "/apis/resource.k8s.io/v1")
    names = [r["name"] for r in resources["resources"]]
    assert {"resourceslices", "resourceclaims", "resourceclaims/status"} <= set(names)
    _, core = await call(client, "GET", "/api/v1")
    assert {"secrets", "nodes", "pods", "namespaces", "configmaps"} <= {
        r["name"] for r in core["resources"]
    }
    _, api = await call(client, "GET", "/api")
    assert api["versions"] == ["v1"]
    accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
    async with client.get("/apis", headers={"Accept": accept}) as resp:
        assert resp.headers["Content-Type"] == (
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        )
        aggregated = await resp.json(content_type=None)
    assert aggregated["kind"] == "APIGroupDiscoveryList"
    assert any(i["metadata"]["name"] == "resource.k8s.io" for i in aggregated["items"])


async def test_openapi_documents(client: aiohttp.ClientSession) -> None:
    _, index = await call(client, "GET", "/openapi/v3")
    url = index["paths"]["apis/resource.k8s.io/v1"]["serverRelativeURL"]
    _, doc = await call(client, "GET", url)
    patch = doc["paths"]["/apis/resource.k8s.io/v1/resourceslices/{name}"]["patch"]
    assert patch["x-kubernetes-group-version-kind"]["kind"] == "ResourceSlice"
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}
    _, v2 = await call(client, "GET", "/openapi/v2")
    assert v2["swagger"] == "2.0"
    proto = {"Accept": "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"}
    assert (await call(client, "GET", "/openapi/v2", headers=proto))[0] == 406


# --- auth, headers, journal --------------------------------------------------------------------


async def test_token_required_and_journal_records_everything(server: APIServer) -> None:
    async with aiohttp.ClientSession(base_url=server.url) as anonymous:
        status, body = await call(anonymous, "GET", SLICES)
        assert (status, body) == (
            401,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "Unauthorized",
                "reason": "Unauthorized",
                "code": 401,
            },
        )
        status, _ = await call(anonymous, "GET", SLICES, headers={"Authorization": "Bearer driver"})
        assert status == 401
    entries = [e for e in server.journal if e.path == SLICES]
    assert [e.headers.get("Authorization") for e in entries] == [None, "Bearer driver"]


async def test_every_response_carries_audit_id_and_cache_control(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    seen = set()
    for path in (SLICES, f"{SLICES}/missing", "/version", "/nonsense", f"{SLICES}?watch=1"):
        async with client.get(path) as resp:
            if "watch" not in path:
                await resp.read()
            seen.add(resp.headers["Audit-Id"])
            assert resp.headers["Cache-Control"] == "no-cache, private"
    async with (
        aiohttp.ClientSession(base_url=server.url) as anonymous,
        anonymous.get(SLICES) as resp,
    ):
        assert resp.status == 401 and resp.headers["Audit-Id"]
    assert len(seen) == 5


async def test_tls_with_token_or_client_certificate(tls_files: TLSFiles) -> None:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tls_files.server_cert, tls_files.server_key)
    api = APIServer(KINDS, token=TOKEN, client_ca_file=str(tls_files.ca))
    url = await api.start(ssl_context=server_ctx)
    try:
        assert url.startswith("https://127.0.0.1:")

        def context(cert: Path | None, key: Path | None) -> ssl.SSLContext:
            ctx = ssl.create_default_context(cafile=str(tls_files.ca))
            if cert and key:
                ctx.load_cert_chain(cert, key)
            return ctx

        async def status_with(ctx: ssl.SSLContext, headers: dict[str, str]) -> int:
            connector = aiohttp.TCPConnector(ssl=ctx)
            async with (
                aiohttp.ClientSession(base_url=url, connector=connector) as session,
                session.get(SLICES, headers=headers) as resp,
            ):
                return resp.status

        assert await status_with(context(tls_files.client_cert, tls_files.client_key), {}) == 200
        assert await status_with(context(None, None), {"Authorization": f"Bearer {TOKEN}"}) == 200
        assert await status_with(context(None, None), {}) == 401
        with pytest.raises(aiohttp.ClientError):
            await status_with(context(tls_files.other_client_cert, tls_files.other_client_key), {})
    finally:
        await api.close()


# --- direct access -----------------------------------------------------------------------------


async def test_direct_seeding_and_context_manager() -> None:
    async with running_api_server(KINDS, objects=[a_claim("c1")]) as api:
        claim = api.get("resource.k8s.io", "resourceclaims", "c1", "default")
        assert claim is not None and claim["metadata"]["uid"]
        claim["metadata"]["name"] = "mutated"  # a copy: the store is unaffected
        assert api.objects("resource.k8s.io", "resourceclaims")[0]["metadata"]["name"] == "c1"
        seeded = api.add(a_slice("s1"))
        assert seeded["metadata"]["resourceVersion"]
        with pytest.raises(ValueError):
            api.add(a_slice("s1"))
        with pytest.raises(ValueError):
            api.add({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}})
        async with aiohttp.ClientSession(base_url=api.url) as session:
            _, body = await call(session, "GET", f"{CLAIMS}/c1")
            assert body["metadata"]["namespace"] == "default"


# --- kubectl -----------------------------------------------------------------------------------


@pytest.mark.kubectl
async def test_kubectl_smoke(tls_files: TLSFiles, tmp_path: Path) -> None:
    # kubectl sends bearer tokens only over HTTPS, so this runs with TLS.
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tls_files.server_cert, tls_files.server_key)
    async with running_api_server(KINDS, token=TOKEN, ssl_context=server_ctx) as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "t",
                    "clusters": [
                        {
                            "name": "c",
                            "cluster": {
                                "server": api.url,
                                "certificate-authority": str(tls_files.ca),
                            },
                        }
                    ],
                    "users": [{"name": "u", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}],
                }
            )
        )
        manifest = tmp_path / "slice.yaml"
        manifest.write_text(json.dumps(a_slice("from-kubectl")))
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}

        async def kubectl(*args: str) -> str:
            proc = await asyncio.create_subprocess_exec(
                "kubectl", *args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, out.decode()
            return out.decode()

        assert "No resources found" in await kubectl("get", "resourceslices")
        assert "created" in await kubectl("create", "-f", str(manifest))
        listing = await kubectl("get", "resourceslices")
        assert "from-kubectl" in listing and "gpu.example.com" in listing
        assert "serverside-applied" in await kubectl("apply", "--server-side", "-f", str(manifest))
        assert "deleted" in await kubectl("delete", "resourceslice", "from-kubectl")
        assert api.objects("resource.k8s.io", "resourceslices") == []
        assert all(e.headers.get("Authorization") == f"Bearer {TOKEN}" for e in api.journal)


async def test_reset_starts_again_from_an_empty_store(
    client: aiohttp.ClientSession, server: APIServer
) -> None:
    server.add(a_slice("s1"))
    async with client.get(f"{SLICES}?watch=true&timeoutSeconds=30") as resp:
        assert (await asyncio.wait_for(resp.content.readline(), 5)).startswith(b'{"type":"ADDED"')
        server.reset()
        assert await asyncio.wait_for(resp.content.read(), 5) == b""  # the open watch ended
    assert server.objects("resource.k8s.io", "resourceslices") == []
    assert server.store.current_rv == 0
    status, body = await call(client, "POST", SLICES, a_slice("s2"))
    assert status == 201 and body["metadata"]["resourceVersion"] == "1"
