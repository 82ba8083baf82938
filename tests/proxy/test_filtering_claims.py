"""ResourceClaims end to end: drivers over real Unix sockets, the embedded API server over real
HTTP. Reads are scoped to the caller's allocations on this node; writes are status only."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.testing.harness import GPU, NIC, NODE, NODE_TOKEN, Kubectl, Running
from tests.recorded import recording, recording_path

GROUP = "resource.k8s.io"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
ALL_CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
PARTIAL = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"


def allocation(driver: str = GPU, node: str = NODE, *, label: bool = False) -> dict[str, Any]:
    if label:
        term = {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            ]
        }
    else:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "devices": {
            "results": [{"request": "req", "driver": driver, "pool": node, "device": "dev-0"}]
        },
        "nodeSelector": {"nodeSelectorTerms": [term]},
    }


def claim(
    name: str,
    driver: str | None = GPU,
    node: str = NODE,
    *,
    label: bool = False,
    namespace: str = "default",
) -> dict[str, Any]:
    """A claim as recording 112 shows it; unallocated when ``driver`` is None."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": {"test": "gk"}},
        "spec": {"devices": {"requests": [{"name": "req"}]}},
    }
    if driver is not None:
        obj["status"] = {"allocation": allocation(driver, node, label=label)}
    return obj


def seed_claims(apiserver: APIServer) -> None:
    apiserver.add(claim("mine"))
    apiserver.add(claim("mine-by-hostname", label=True))
    apiserver.add(claim("mine-elsewhere", namespace="other"))
    apiserver.add(claim("nics", NIC))
    apiserver.add(claim("other-node", GPU, "node-b"))
    apiserver.add(claim("other-node-by-hostname", GPU, "node-b", label=True))
    apiserver.add(claim("unallocated", None))


VISIBLE = {"mine", "mine-by-hostname"}
HIDDEN = ["nics", "other-node", "other-node-by-hostname", "unallocated"]


class Admin:
    """Changes made straight at the API server, as the scheduler or an admin would."""

    def __init__(self, apiserver: APIServer) -> None:
        self.apiserver = apiserver
        self.headers = {"Authorization": f"Bearer {NODE_TOKEN}"}

    async def put_status(self, name: str, status: dict[str, Any] | None) -> dict[str, Any]:
        stored = self.apiserver.get(GROUP, "resourceclaims", name, "default")
        assert stored is not None
        body = copy.deepcopy(stored)
        if status is None:
            body.pop("status", None)
        else:
            body["status"] = status
        async with aiohttp.ClientSession(self.apiserver.url) as session:
            response = await session.put(f"{CLAIMS}/{name}/status", json=body, headers=self.headers)
            assert response.status == 200, await response.text()
            return await response.json()

    async def create(self, obj: dict[str, Any]) -> None:
        async with aiohttp.ClientSession(self.apiserver.url) as session:
            response = await session.post(CLAIMS, json=obj, headers=self.headers)
            assert response.status == 201, await response.text()


async def next_event(watch: aiohttp.ClientResponse) -> tuple[str, str, dict[str, Any]]:
    line = await asyncio.wait_for(watch.content.readline(), 10)
    assert line, "the watch ended"
    event = json.loads(line)
    return event["type"], event["object"]["metadata"].get("name", ""), event["object"]


def upstream_accepts(apiserver: APIServer, since: int) -> list[str]:
    return [e.headers.get("Accept", "") for e in apiserver.journal[since:] if e.method == "GET"]


# --- reads ---------------------------------------------------------------------------------


async def test_get_shows_only_claims_in_scope(gatekeeper: Running, apiserver: APIServer) -> None:
    seed_claims(apiserver)
    async with (
        gatekeeper.unix_session(GPU) as session,
        aiohttp.ClientSession(apiserver.url) as direct,
    ):
        for name in VISIBLE:
            response = await session.get(f"{CLAIMS}/{name}")
            assert response.status == 200, await response.text()
            assert (await response.json())["metadata"]["name"] == name
        missing = await direct.get(
            f"{CLAIMS}/no-such-claim", headers={"Authorization": f"Bearer {NODE_TOKEN}"}
        )
        for name in HIDDEN:
            response = await session.get(f"{CLAIMS}/{name}")
            body = await response.json()
            # Exactly what the apiserver answers for a claim that does not exist.
            assert response.status == 404
            expected = await missing.json()
            assert body["message"] == expected["message"].replace("no-such-claim", name)
            assert body["reason"] == "NotFound" and body["details"]["name"] == name
        status = await session.get(f"{CLAIMS}/mine/status")
        assert status.status == 200
        assert (await session.get(f"{CLAIMS}/nics/status")).status == 404


@pytest.mark.parametrize("path", [CLAIMS, ALL_CLAIMS], ids=["namespace", "all-namespaces"])
async def test_list_is_filtered(gatekeeper: Running, apiserver: APIServer, path: str) -> None:
    seed_claims(apiserver)
    async with gatekeeper.unix_session(GPU) as gpu, gatekeeper.unix_session(NIC) as nic:
        listed = await (await gpu.get(path)).json()
        names = {item["metadata"]["name"] for item in listed["items"]}
        expected = VISIBLE | ({"mine-elsewhere"} if path == ALL_CLAIMS else set())
        assert names == expected
        assert listed["kind"] == "ResourceClaimList"
        nics = await (await nic.get(path)).json()
        assert [item["metadata"]["name"] for item in nics["items"]] == ["nics"]


async def test_a_paged_list_is_answered_in_full_without_a_continue_token(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """client-go's pager asks limit=500 and follows continue: a full answer without one ends
    its paging. The driver's limit never reaches the upstream (the gatekeeper's pages do)."""
    seed_claims(apiserver)
    since = len(apiserver.journal)
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.get(f"{ALL_CLAIMS}?limit=1")
        page = await response.json()
    assert response.status == 200
    assert {item["metadata"]["name"] for item in page["items"]} == VISIBLE | {"mine-elsewhere"}
    assert set(page["metadata"]) == {"resourceVersion"}  # no continue, no remainingItemCount
    (listed,) = [parse_qs(e.query_string) for e in apiserver.journal[since:]]
    assert listed["limit"] == ["500"]


@pytest.mark.parametrize("accept", [TABLE, PARTIAL], ids=["table", "partial-object-metadata"])
async def test_negotiated_lists_never_leak(
    gatekeeper: Running, apiserver: APIServer, accept: str
) -> None:
    """kubectl asks for a Table (recording 116), others for metadata only (119): neither
    carries the status the scope needs, so the gatekeeper asks for JSON and filters."""
    seed_claims(apiserver)
    since = len(apiserver.journal)
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.get(ALL_CLAIMS, headers={"Accept": accept})
        listed = await response.json()
        single = await session.get(f"{CLAIMS}/mine", headers={"Accept": TABLE})
        one = await single.json()
    assert response.status == 200
    assert listed["kind"] == "ResourceClaimList"
    assert {item["metadata"]["name"] for item in listed["items"]} == VISIBLE | {"mine-elsewhere"}
    assert single.status == 200 and one["kind"] == "ResourceClaim"
    assert set(upstream_accepts(apiserver, since)) == {"application/json"}


async def test_a_table_watch_gets_filtered_json_events(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    admin = Admin(apiserver)
    since = len(apiserver.journal)
    async with gatekeeper.unix_session(GPU) as session:
        watch = await session.get(f"{CLAIMS}?watch=true", headers={"Accept": TABLE})
        for name, driver in (("nics", NIC), ("gpus", GPU)):
            await admin.create(claim(name, None))
            await admin.put_status(name, {"allocation": allocation(driver)})
        kind, name, obj = await next_event(watch)
        assert (kind, name, obj["kind"]) == ("ADDED", "gpus", "ResourceClaim")
        watch.close()
    assert upstream_accepts(apiserver, since)[0] == "application/json"


async def test_slices_negotiation_passes_through(gatekeeper: Running, apiserver: APIServer) -> None:
    """Nothing is filtered for slices: the Table the client asked for is what it gets."""
    since = len(apiserver.journal)
    pinned = f"fieldSelector=spec.driver%3D{GPU}%2Cspec.nodeName%3D{NODE}"
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.get(
            f"/apis/resource.k8s.io/v1/resourceslices?{pinned}", headers={"Accept": TABLE}
        )
        assert (await response.json())["kind"] == "Table"
    assert upstream_accepts(apiserver, since) == [TABLE]


async def test_watch_is_filtered_event_by_event(gatekeeper: Running, apiserver: APIServer) -> None:
    admin = Admin(apiserver)
    async with gatekeeper.unix_session(GPU) as session:
        watch = await session.get(f"{CLAIMS}?watch=true&timeoutSeconds=60&allowWatchBookmarks=true")
        assert watch.status == 200
        await admin.create(claim("nics", None))
        await admin.put_status("nics", {"allocation": allocation(NIC)})  # not ours: no event
        await admin.create(claim("later", None))  # unallocated: no event
        # Allocated to this driver elsewhere, then here: it enters scope as ADDED.
        await admin.put_status("later", {"allocation": allocation(GPU, "node-b")})
        await admin.put_status("later", {"allocation": allocation(GPU)})
        assert (await next_event(watch))[:2] == ("ADDED", "later")
        # A change while in scope: MODIFIED, in full.
        updated = await admin.put_status(
            "later", {"allocation": allocation(GPU), "reservedFor": [{"name": "p"}]}
        )
        kind, name, obj = await next_event(watch)
        assert (kind, name) == ("MODIFIED", "later")
        assert obj["status"]["reservedFor"] == [{"name": "p"}]
        # Moved to another node: DELETED once, without its new state.
        moved = await admin.put_status("later", {"allocation": allocation(GPU, "node-b")})
        kind, name, obj = await next_event(watch)
        assert (kind, name) == ("DELETED", "later")
        assert "status" not in obj and obj["metadata"]["uid"] == updated["metadata"]["uid"]
        assert obj["metadata"]["resourceVersion"] == moved["metadata"]["resourceVersion"]
        await admin.put_status("later", {"allocation": allocation(GPU, "node-c")})  # no event
        # Back in scope: ADDED again; the stream stayed open throughout.
        await admin.put_status("later", {"allocation": allocation(GPU)})
        assert (await next_event(watch))[:2] == ("ADDED", "later")
        # Deallocated: DELETED once.
        await admin.put_status("later", None)
        assert (await next_event(watch))[:2] == ("DELETED", "later")
        kind, _, obj = await next_event(watch)  # bookmarks pass (every second upstream)
        assert kind == "BOOKMARK" and obj["metadata"]["resourceVersion"]
        watch.close()


async def test_watch_continuing_a_list_knows_what_the_list_showed(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """The informer pattern: list, then watch from the list's resourceVersion. A claim the
    list showed that leaves scope right away is still sent as DELETED."""
    seed_claims(apiserver)
    admin = Admin(apiserver)
    async with gatekeeper.unix_session(GPU) as session:
        listed = await (await session.get(CLAIMS)).json()
        rv = listed["metadata"]["resourceVersion"]
        watch = await session.get(f"{CLAIMS}?watch=true&resourceVersion={rv}&timeoutSeconds=60")
        assert watch.status == 200
        await admin.put_status("other-node", {"allocation": allocation(NIC)})  # never shown
        await admin.put_status("mine", {"allocation": allocation(NIC)})
        assert (await next_event(watch))[:2] == ("DELETED", "mine")
        await admin.put_status("mine-by-hostname", {"allocation": allocation(GPU), "x": 1})
        assert (await next_event(watch))[:2] == ("MODIFIED", "mine-by-hostname")
        watch.close()


async def test_watch_of_a_foreign_driver_sees_nothing_of_ours(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    admin = Admin(apiserver)
    async with gatekeeper.unix_session(NIC) as session:
        watch = await session.get(f"{ALL_CLAIMS}?watch=true&timeoutSeconds=60")
        for name, driver in (("gpus", GPU), ("nics", NIC)):
            await admin.create(claim(name, None))  # a create drops status, as the apiserver's
            await admin.put_status(name, {"allocation": allocation(driver)})
        assert (await next_event(watch))[:2] == ("ADDED", "nics")
        watch.close()


# --- status writes ---------------------------------------------------------------------------


def device(driver: str = GPU, name: str = "dev-0", ready: str = "True") -> dict[str, Any]:
    return {
        "driver": driver,
        "pool": NODE,
        "device": name,
        "conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "m"}],
    }


def shared_claim() -> dict[str, Any]:
    """Allocated to both drivers on this node, with the NIC driver's status entry."""
    obj = claim("shared")
    obj["status"]["allocation"]["devices"]["results"].append(
        {"request": "req", "driver": NIC, "pool": NODE, "device": "nic-0"}
    )
    obj["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "p1"}]
    obj["status"]["devices"] = [device(NIC, "nic-0")]
    return obj


def edit(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return obj


STATUS_WRITES = [
    ("add-own-entry", ("status", "devices"), [device(NIC, "nic-0"), device()], None),
    (
        "add-other-driver-entry",
        ("status", "devices"),
        [device(NIC, "nic-0"), device(NIC, "nic-1")],
        'status.devices[1] is added for driver "nic.example.com"',
    ),
    (
        "remove-other-driver-entry",
        ("status", "devices"),
        [device()],
        'status.devices[0] of driver "nic.example.com" is removed',
    ),
    (
        "modify-other-driver-entry",
        ("status", "devices"),
        [device(NIC, "nic-0", ready="False")],
        "status.devices[0].conditions[0].status differs",
    ),
    (
        "change-allocation",
        ("status", "allocation", "devices", "results", 0, "device"),
        "dev-9",
        "status.allocation.devices.results[0].device differs",
    ),
    ("change-reserved-for", ("status", "reservedFor"), [], "status.reservedFor[0] differs"),
    (
        "change-metadata",
        ("metadata", "labels"),
        {"test": "gk", "x": "y"},
        "metadata.labels.x differs",
    ),
]


@pytest.mark.parametrize(
    ("path", "value", "refusal"), [c[1:] for c in STATUS_WRITES], ids=[c[0] for c in STATUS_WRITES]
)
async def test_status_put(
    gatekeeper: Running, apiserver: APIServer, path: tuple[Any, ...], value: Any, refusal: Any
) -> None:
    stored = apiserver.add(shared_claim())
    since = len(apiserver.journal)
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.put(f"{CLAIMS}/shared/status", json=edit(stored, path, value))
        body = await response.json()
    after = apiserver.get(GROUP, "resourceclaims", "shared", "default")
    if refusal is None:
        assert response.status == 200, body
        assert after["status"]["devices"] == value
    else:
        assert response.status == 403, body
        assert refusal in body["message"]
        assert body["message"].startswith('resourceclaims.resource.k8s.io "shared" is forbidden')
        assert after == stored
        assert [e.method for e in apiserver.journal[since:]] == ["GET"]  # only the fetch


async def test_status_merge_patch_as_recorded(gatekeeper: Running, apiserver: APIServer) -> None:
    """Recording 136: a driver updates its device's conditions with a merge patch."""
    stored = claim("c")
    stored["status"]["devices"] = [device()]
    stored = apiserver.add(stored)
    patch = {"status": {"devices": [device(ready="False")]}}
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.patch(
            f"{CLAIMS}/c/status",
            data=json.dumps(patch),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert response.status == 200, await response.text()
        # The same patch from the NIC driver: the claim is not in its scope.
        async with gatekeeper.unix_session(NIC) as nic:
            refused = await nic.patch(
                f"{CLAIMS}/c/status",
                data=json.dumps(patch),
                headers={"Content-Type": "application/merge-patch+json"},
            )
            assert refused.status == 404
    after = apiserver.get(GROUP, "resourceclaims", "c", "default")
    assert after["status"]["devices"][0]["conditions"][0]["status"] == "False"
    forwarded = [e for e in apiserver.journal if e.method == "PATCH"]
    assert len(forwarded) == 1
    assert (
        json.loads(forwarded[0].body)["metadata"]["resourceVersion"]
        == (stored["metadata"]["resourceVersion"])
    )


async def test_status_strategic_merge_is_previewed(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    apiserver.add(shared_claim())
    patch = {"status": {"devices": [device(NIC, "nic-0"), device()]}}
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.patch(
            f"{CLAIMS}/shared/status",
            data=json.dumps(patch),
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        assert response.status == 200, await response.text()
    patches = [e for e in apiserver.journal if e.method == "PATCH"]
    assert patches[0].query_string == "dryRun=All"
    assert len(patches) == 2


REFUSED_WRITES = [
    ("put-main-resource", "PUT", "/shared", 403, "status subresource"),
    ("patch-main-resource", "PATCH", "/shared", 403, "status subresource"),
    ("delete", "DELETE", "/shared", 403, "not allowed"),
    ("create", "POST", "", 403, "not allowed"),
]


@pytest.mark.parametrize(
    ("method", "suffix", "code", "message"),
    [c[1:] for c in REFUSED_WRITES],
    ids=[c[0] for c in REFUSED_WRITES],
)
async def test_other_writes_never_reach_upstream(
    gatekeeper: Running, apiserver: APIServer, method: str, suffix: str, code: int, message: str
) -> None:
    stored = apiserver.add(shared_claim())
    since = len(apiserver.journal)
    patching = method == "PATCH"
    headers = {"Content-Type": "application/merge-patch+json" if patching else "application/json"}
    body = {} if patching else stored
    async with gatekeeper.unix_session(GPU) as session:
        response = await session.request(
            method, f"{CLAIMS}{suffix}", data=json.dumps(body), headers=headers
        )
        status = await response.json()
    assert response.status == code and message in status["message"]
    assert apiserver.journal[since:] == []


@pytest.mark.kubectl
async def test_kubectl_get_claims_shows_only_ours(
    kubectl: Kubectl, gatekeeper: Running, apiserver: APIServer
) -> None:
    """kubectl asks for a Table; it gets the filtered plain list and prints it."""
    seed_claims(apiserver)
    code, out, err = await kubectl("get", "resourceclaims", "-A")
    assert code == 0, err
    printed = {line.split()[1] for line in out.splitlines()[1:]}
    assert printed == VISIBLE | {"mine-elsewhere"}
    code, out, err = await kubectl("get", "resourceclaim", "nics", "-o", "name")
    assert code == 1 and 'resourceclaims.resource.k8s.io "nics" not found' in err
    code, out, err = await kubectl(
        "get", "resourceclaim", "mine", "-o", "jsonpath={.metadata.name}"
    )
    assert (code, out) == (0, "mine"), err


def recorded_status(name: str) -> bytes:
    """The Status a real kube-apiserver answered, serialized in its own key order."""
    number = int(name.split("-", 1)[0])
    assert recording_path(number).name == name
    return json.dumps(recording(number)["response_body"]).encode()


async def test_absent_and_hidden_objects_answer_the_apiservers_not_found(
    gatekeeper: Running, apiserver: APIServer
) -> None:
    """DESIGN §4.3: a hidden claim and an absent one get the same bytes, the apiserver's."""
    claim_404 = recorded_status("144-admin-get-resourceclaim-after-delete-404.json")
    slice_404 = recorded_status("25-get-resourceslice-404.json")
    async with gatekeeper.unix_session(GPU) as session:
        absent = await session.get(f"{CLAIMS}/gk-claim-1")
        assert absent.status == 404
        assert json.dumps(await absent.json()).encode() == claim_404
        apiserver.add(claim("gk-claim-1", NIC))
        hidden = await session.get(f"{CLAIMS}/gk-claim-1")
        assert hidden.status == 404
        assert json.dumps(await hidden.json()).encode() == claim_404
        missing = await session.get("/apis/resource.k8s.io/v1/resourceslices/does-not-exist")
        assert missing.status == 404
        assert json.dumps(await missing.json()).encode() == slice_404
