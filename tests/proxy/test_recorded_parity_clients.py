"""End to end, claims and the upstream clients: the apiserver's merge semantics on claim
status, the official Python client's read-modify-write, WatchList through
the claim filter, the NotFound of a hidden claim in every version, and the request sequence of
the DRA helper library's ResourceSlice publisher."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.testing.harness import GPU, NIC, NODE, NODE_TOKEN, Running, write_kubeconfig

GROUP = "resource.k8s.io"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MERGE = "application/merge-patch+json"
END = "k8s.io/initial-events-end"
WATCH_LIST = (
    "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
    "&allowWatchBookmarks=true&timeoutSeconds=5"
)


def claim(name: str, *drivers: str, node: str = NODE) -> dict[str, Any]:
    """A claim allocated to ``drivers`` on ``node`` (as recording 179 allocates one)."""
    results = [
        {"request": f"r{i}", "driver": d, "pool": node, "device": f"dev-{i}"}
        for i, d in enumerate(drivers)
    ]
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": f"r{i}"} for i in range(len(drivers))]}},
    }
    if drivers:
        obj["status"] = {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [selector]},
            }
        }
    return obj


async def admin(apiserver: APIServer, method: str, target: str, body: Any) -> dict[str, Any]:
    """A write straight at the API server, as the scheduler or another driver would make it."""
    headers = {"Authorization": f"Bearer {NODE_TOKEN}"}
    async with aiohttp.ClientSession(apiserver.url) as session:
        response = await session.request(method, target, json=body, headers=headers)
        assert response.status < 300, await response.text()
        return await response.json()


async def shared_claim(apiserver: APIServer) -> dict[str, Any]:
    """Recordings 178-181: allocated to GPU and NIC; the NIC driver's entry carries a null in
    its opaque data, stored as sent; the apiserver serves it with ``"conditions": null``."""
    obj = apiserver.add(claim("shared", GPU, NIC))
    obj["status"]["devices"] = [
        {"driver": NIC, "pool": NODE, "device": "dev-1", "data": {"vlan": None, "mtu": 9000}}
    ]
    return await admin(apiserver, "PUT", f"{CLAIMS}/shared/status", obj)


async def send(
    gatekeeper: Running, method: str, target: str, body: Any = None, media_type: str = ""
) -> tuple[int, Any]:
    headers = {"Content-Type": media_type or "application/json"} if body is not None else {}
    async with gatekeeper.unix_session(GPU) as session:
        data = None if body is None else json.dumps(body)
        response = await session.request(method, target, data=data, headers=headers)
        return response.status, await response.json(content_type=None)


# --- 4: the apiserver's merge semantics decide a claim status patch ---------------------------


async def test_a_merge_patch_echoing_a_null_is_refused_like_the_put(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """182-183: the apiserver stores an echoed ``{"vlan": null, "mtu": 9000}`` as
    ``{"mtu": 9000}`` through a merge patch: a change to the NIC driver's entry."""
    stored = await shared_claim(apiserver)
    nic = copy.deepcopy(stored["status"]["devices"][0])
    mine = {"driver": GPU, "pool": NODE, "device": "dev-0", "data": {"uuid": "GPU-0000"}}
    patch = {"status": {"devices": [nic, mine]}}
    status, answer = await send(gatekeeper, "PATCH", f"{CLAIMS}/shared/status", patch, MERGE)
    assert status == 403, answer
    assert "status.devices[0].data.vlan differs from the stored object" in answer["message"]
    after = apiserver.get(GROUP, "resourceclaims", "shared", "default")
    assert after is not None and after["status"]["devices"][0]["data"] == {
        "vlan": None,
        "mtu": 9000,
    }
    # The equivalent PUT keeps the NIC driver's entry as it is, and is allowed.
    body = copy.deepcopy(stored)
    body["status"]["devices"] = [nic, mine]
    status, answer = await send(gatekeeper, "PUT", f"{CLAIMS}/shared/status", body)
    assert status == 200, answer
    assert answer["status"]["devices"][0]["data"] == {"vlan": None, "mtu": 9000}


# --- 5: the official Python client's read-modify-write ----------------------------------------


async def test_the_python_clients_status_read_modify_write(
    gatekeeper: Running, apiserver: APIServer, tmp_path: Path
) -> None:
    """186-187: the client re-sends ``…Z`` times as ``…+00:00`` and drops ``conditions: null``;
    the apiserver stores the same thing, so the gatekeeper must not call it a change."""
    kubernetes = pytest.importorskip("kubernetes")
    stored = await shared_claim(apiserver)
    stored["status"]["devices"][0]["conditions"] = [
        {
            "type": "Ready",
            "status": "True",
            "lastTransitionTime": "2026-12-02T21:30:00Z",
            "reason": "DeviceReady",
            "message": "nic ready",
        }
    ]
    stored["status"]["devices"].append({"driver": GPU, "pool": NODE, "device": "dev-0"})
    served = await admin(apiserver, "PUT", f"{CLAIMS}/shared/status", stored)
    assert served["status"]["devices"][1]["conditions"] is None, "as the apiserver serves it"
    kubeconfig = write_kubeconfig(tmp_path, gatekeeper, GPU)

    def read_modify_write() -> Any:
        client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        api = kubernetes.client.ResourceV1Api(client)
        try:
            read = api.read_namespaced_resource_claim("shared", "default")
            for entry in read.status.devices:
                if entry.driver == GPU:
                    entry.data = {"uuid": "GPU-0000"}
            return api.replace_namespaced_resource_claim_status("shared", "default", read)
        finally:
            client.close()

    written = await asyncio.to_thread(read_modify_write)
    gpu = next(entry for entry in written.status.devices if entry.driver == GPU)
    assert gpu.data == {"uuid": "GPU-0000"}
    sent = json.loads(apiserver.journal[-1].body)
    assert sent["metadata"]["creationTimestamp"].endswith("+00:00"), "the client re-spells times"


# --- WatchList through the claim filter; NotFound of a hidden claim ---------------------------


async def read_until_initial_events_end(watch: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    events = []
    while True:
        line = await asyncio.wait_for(watch.content.readline(), 10)
        assert line, f"the watch ended before the {END} bookmark: {events}"
        event = json.loads(line)
        events.append(event)
        annotations = event["object"]["metadata"].get("annotations") or {}
        if event["type"] == "BOOKMARK" and annotations.get(END) == "true":
            return events


async def next_change(watch: aiohttp.ClientResponse) -> dict[str, Any]:
    """The next event that is not a (periodic) BOOKMARK."""
    while True:
        line = await asyncio.wait_for(watch.content.readline(), 10)
        assert line, "the watch ended"
        event = json.loads(line)
        if event["type"] != "BOOKMARK":
            return event


async def test_watch_list_through_the_claim_filter(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """189: ADDED per claim, then the BOOKMARK annotated initial-events-end; never a claim out
    of the driver's scope."""
    apiserver.add(claim("a-mine", GPU))
    apiserver.add(claim("b-nics", NIC))
    apiserver.add(claim("c-other-node", GPU, node="node-b"))
    apiserver.add(claim("d-unallocated"))
    apiserver.add(claim("e-mine-too", NIC, GPU))
    async with gatekeeper.unix_session(GPU) as session:
        target = f"/apis/resource.k8s.io/v1/resourceclaims?{WATCH_LIST}"
        async with session.get(target) as watch:
            assert watch.status == 200
            events = await read_until_initial_events_end(watch)
            apiserver.add(claim("f-nics-later", NIC))
            apiserver.add(claim("g-mine-later", GPU))
            later = await next_change(watch)
    added = [e["object"]["metadata"]["name"] for e in events if e["type"] == "ADDED"]
    assert added == ["a-mine", "e-mine-too"]
    assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
    assert (later["type"], later["object"]["metadata"]["name"]) == ("ADDED", "g-mine-later")


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
async def test_a_hidden_claim_is_the_apiservers_not_found(
    gatekeeper: Running, apiserver: APIServer, version: str
) -> None:
    """The DRA helper's converting client retries v1 → v1beta2 → v1beta1 on a 404: each answer
    must be the one the apiserver gives for a claim that does not exist, in that version."""
    apiserver.add(claim("hidden", NIC))
    path = f"/apis/resource.k8s.io/{version}/namespaces/default/resourceclaims/hidden"
    status, answer = await send(gatekeeper, "GET", path)
    missing = path.replace("/default/", "/nowhere/")
    async with aiohttp.ClientSession(apiserver.url) as session:
        direct = await session.get(missing, headers={"Authorization": f"Bearer {NODE_TOKEN}"})
        assert (status, answer) == (direct.status, await direct.json())


# --- the DRA helper library's ResourceSlice publisher -----------------------------------------


async def test_the_resource_slice_publishers_request_sequence(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """What k8s.io/dynamic-resource-allocation/resourceslice does, request by request: a
    WatchList informer (188), the Node GET for the owner reference (197), creates with
    ``generateName``, PUT updates, deletes with uid/resourceVersion preconditions."""
    node = apiserver.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    selector = f"fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3D{NODE}"
    headers = {"Accept": "application/json, */*", "User-Agent": "gpu-kubelet-plugin"}
    target = f"{SLICES}?{selector}&{WATCH_LIST}"
    async with (
        gatekeeper.unix_session(GPU) as session,
        session.get(target, headers=headers) as watch,
    ):
        assert watch.status == 200
        assert [e["type"] for e in await read_until_initial_events_end(watch)] == ["BOOKMARK"]

        async def next_event() -> tuple[str, dict[str, Any]]:
            event = await next_change(watch)
            return event["type"], event["object"]

        got = await session.get(f"/api/v1/nodes/{NODE}", headers=headers)
        assert got.status == 200
        owner = await got.json()
        assert owner["metadata"]["uid"] == node["metadata"]["uid"]
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "generateName": f"{NODE}-{GPU}-",
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": NODE,
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": GPU,
                "nodeName": NODE,
                "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0"}],
            },
        }
        created = await session.post(SLICES, json=body, headers=headers)
        assert created.status == 201, await created.text()
        obj = await created.json()
        name = obj["metadata"]["name"]
        assert name.startswith(f"{NODE}-{GPU}-")
        assert await next_event() == ("ADDED", obj)

        obj["spec"]["pool"]["generation"] = 2
        obj["spec"]["devices"].append({"name": "gpu-1"})
        updated = await session.put(f"{SLICES}/{name}", json=obj, headers=headers)
        assert updated.status == 200, await updated.text()
        obj = await updated.json()
        assert await next_event() == ("MODIFIED", obj)

        options = {
            "preconditions": {
                "uid": obj["metadata"]["uid"],
                "resourceVersion": obj["metadata"]["resourceVersion"],
            }
        }
        deleted = await session.delete(f"{SLICES}/{name}", json=options, headers=headers)
        assert deleted.status == 200, await deleted.text()
        kind, gone = await next_event()
        assert kind == "DELETED" and gone["metadata"]["name"] == name
    assert apiserver.get(GROUP, "resourceslices", name) is None
