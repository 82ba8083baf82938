"""The response filter of scoped kinds: watch state, line splitting, bounded reads; and end to
end, that nothing about a claim hidden from a driver reaches it, in any field."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote

import aiohttp
import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.apiserver._list import encode_continue
from gatekeeper.errors import UpstreamError
from gatekeeper.policy import Decision
from gatekeeper.proxy import filtering, paging
from gatekeeper.proxy.filtering import scoped_chunks
from gatekeeper.proxy.scoped import WatchFilter
from gatekeeper.request.requestinfo import RequestInfo, parse_request
from gatekeeper.status import status_body
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    NODE_TOKEN,
    MockResponse,
    Running,
    running_gatekeeper,
)
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import UpstreamResponse, UpstreamSession

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
ALL_CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
PARTIAL = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"


def obj(name: str, mine: bool, rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"u-{name}",
            "resourceVersion": rv,
        },
        "status": {"mine": mine},
    }


def keep(o: dict[str, Any]) -> bool:
    return bool(o.get("status", {}).get("mine"))


def ev(kind: str, o: Any) -> dict[str, Any]:
    return {"type": kind, "object": o}


STUB = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "a", "namespace": "default", "uid": "u-a", "resourceVersion": "3"},
}
SEQUENCES = [
    ("added-in-scope", [ev("ADDED", obj("a", True))], ["ADDED"]),
    ("added-out-of-scope", [ev("ADDED", obj("a", False))], []),
    ("enters-as-added", [ev("ADDED", obj("a", False)), ev("MODIFIED", obj("a", True))], ["ADDED"]),
    (
        "leaves-as-deleted-once",
        [
            ev("ADDED", obj("a", True)),
            ev("MODIFIED", obj("a", False, "3")),
            ev("MODIFIED", obj("a", False, "4")),
        ],
        ["ADDED", "DELETED"],
    ),
    (
        "deleted-in-scope",
        [ev("ADDED", obj("a", True)), ev("DELETED", obj("a", True))],
        ["ADDED", "DELETED"],
    ),
    ("deleted-never-shown", [ev("DELETED", obj("a", False))], []),
    ("bookmark-passes", [ev("BOOKMARK", {"metadata": {"resourceVersion": "9"}})], ["BOOKMARK"]),
    ("error-passes", [ev("ERROR", {"kind": "Status", "code": 410})], ["ERROR"]),
    ("unknown-type-dropped", [ev("WEIRD", obj("a", True))], []),
    ("not-an-object-dropped", [ev("ADDED", ["x"]), "junk"], []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("events", "types"), [c[1:] for c in SEQUENCES], ids=[c[0] for c in SEQUENCES]
)
def test_watch_state(events: list[Any], types: list[str]) -> None:
    state = WatchFilter(keep)
    out = [e for e in (state.event(event) for event in events) if e is not None]
    assert [e["type"] for e in out] == types


def test_a_deleted_stub_shows_only_identity() -> None:
    state = WatchFilter(keep)
    state.event(ev("ADDED", obj("a", True)))
    assert state.event(ev("MODIFIED", obj("a", False, "3"))) == ev("DELETED", STUB)


def test_a_primed_state_knows_what_the_list_showed() -> None:
    state = WatchFilter(keep, {("default", "a")})
    assert state.event(ev("MODIFIED", obj("a", True)))["type"] == "MODIFIED"
    assert state.event(ev("MODIFIED", obj("a", False, "3"))) == ev("DELETED", STUB)


async def content(*chunks: bytes) -> AsyncIterator[bytes]:
    """An upstream body that arrives in the given chunks."""
    for chunk in chunks:
        yield chunk


async def collect(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


def pages_of(*bodies: bytes) -> paging.PageOpener:
    """Upstream pages answering, in turn, ``bodies`` (each in chunks of 7 bytes): answers no
    real server gives (a Table to a plain JSON list), for the reader's refusals."""
    answers = list(bodies)

    @asynccontextmanager
    async def page(info: RequestInfo) -> AsyncIterator[UpstreamResponse]:
        yield _Chunked(body=answers.pop(0))

    return page


class _Chunked(MockResponse):
    async def chunks(self) -> AsyncIterator[bytes]:
        body, self.body = self.body, b""
        for start in range(0, len(body), 7):
            yield body[start : start + 7]


async def test_watch_lines_split_across_chunks() -> None:
    lines = [json.dumps(ev("ADDED", obj(n, n != "b"))).encode() for n in "abc"]
    stream = b"\n".join(lines) + b"\n"
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    info = parse_request("GET", f"{CLAIMS}?watch=true")
    out = await collect(await scoped_chunks(info, content(*pieces), WatchFilter(keep)))
    names = [json.loads(line)["object"]["metadata"]["name"] for line in out.splitlines()]
    assert names == ["a", "c"]
    assert out.splitlines()[0] == lines[0]  # passed through byte for byte


async def test_an_overlong_watch_line_ends_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filtering, "MAX_WATCH_LINE", 100)
    info = parse_request("GET", f"{CLAIMS}?watch=true")
    first = json.dumps(ev("ADDED", obj("a", True))).encode() + b"\n"
    body = content(first, b"{" + b" " * 80, b" " * 80)
    out = (await collect(await scoped_chunks(info, body, WatchFilter(keep)))).splitlines()
    assert json.loads(out[0])["type"] == "ADDED"
    error = json.loads(out[1])
    assert error["type"] == "ERROR" and "exceeds 100 bytes" in error["object"]["message"]


async def test_a_list_is_filtered_and_a_table_refused() -> None:
    info = parse_request("GET", CLAIMS)
    listing = {
        "kind": "ResourceClaimList",
        "metadata": {"remainingItemCount": 5, "resourceVersion": "7"},
        "items": [obj("a", True), obj("b", False)],
    }
    read = await paging.read_list(pages_of(json.dumps(listing).encode()), info, keep)
    out = json.loads(read.body)
    assert [i["metadata"]["name"] for i in out["items"]] == ["a"]
    assert out["metadata"] == {"resourceVersion": "7"} and read.shown == {("default", "a")}
    table = {"kind": "Table", "rows": [{"object": obj("b", False)}]}
    with pytest.raises(UpstreamError, match="'Table', not a list"):
        await paging.read_list(pages_of(json.dumps(table).encode()), info, keep)


async def test_a_list_past_the_answer_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A list is answered whole, so what is kept of it is bounded (502 past the bound)."""
    listing = {"kind": "ResourceClaimList", "items": [obj(n, True) for n in "abc"]}
    body = json.dumps(listing).encode()
    monkeypatch.setattr(paging, "MAX_FILTERED_ANSWER", 2 * len(json.dumps(obj("a", True))))
    with pytest.raises(UpstreamError, match="exceed"):
        await paging.read_list(pages_of(body), parse_request("GET", CLAIMS), keep)


async def test_a_get_out_of_scope_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    info = parse_request("GET", f"{CLAIMS}/b")
    refused = await scoped_chunks(
        info, content(json.dumps(obj("b", False)).encode()), WatchFilter(keep)
    )
    assert isinstance(refused, Decision)
    assert refused.code == 404
    assert refused.message == 'resourceclaims.resource.k8s.io "b" not found'
    monkeypatch.setattr(filtering, "MAX_FILTERED_OBJECT", 10)
    with pytest.raises(UpstreamError, match="exceeds 10 bytes"):
        await scoped_chunks(info, content(json.dumps(obj("b", True)).encode()), WatchFilter(keep))


# --- end to end: nothing about a hidden claim reaches the driver -----------------------------


@dataclass
class ClaimsUpstream:
    """The API server claims are created in and the gatekeeper forwards to (URL, the node's
    token, a namespace of its own): the embedded API server here; any other upstream can be
    added to the fixture's params. The real tier's run of the same attack, against
    kube-apiserver 1.36 and a ``serve`` process, is ``tests/realcluster/test_paging.py``."""

    url: str
    token: str
    namespace: str
    ssl: Any = None

    def session(self) -> aiohttp.ClientSession:
        headers = {"Authorization": f"Bearer {self.token}"}
        connector = aiohttp.TCPConnector(ssl=self.ssl if self.ssl is not None else False)
        return aiohttp.ClientSession(self.url, headers=headers, connector=connector)

    async def create(self, name: str, driver: str | None, node: str = NODE) -> dict[str, Any]:
        """A claim, allocated to ``driver`` on ``node`` (unallocated when None), made as the
        scheduler would: create, then write its status."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{self.namespace}/resourceclaims"
        body: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "devices": {"requests": [{"name": "req", "exactly": {"deviceClassName": "c"}}]}
            },
        }
        async with self.session() as session:
            async with session.post(path, json=body) as response:
                assert response.status == 201, await response.text()
                created = await response.json()
            if driver is None:
                return dict(created)
            created["status"] = {"allocation": _allocation(driver, node)}
            async with session.put(f"{path}/{name}/status", json=created) as response:
                assert response.status == 200, await response.text()
                return dict(await response.json())


def _allocation(driver: str, node: str) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "devices": {"results": [{"request": "req", "driver": driver, "pool": node, "device": "d"}]},
        "nodeSelector": {"nodeSelectorTerms": [term]},
    }


@pytest.fixture(params=["embedded"])
async def claims_upstream(request: pytest.FixtureRequest, apiserver: APIServer) -> ClaimsUpstream:
    return ClaimsUpstream(apiserver.url, NODE_TOKEN, "tenant-a")


@pytest.fixture(params=[2, paging.PAGE_SIZE], ids=["pages-of-2", "one-page"])
def page_size(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The gatekeeper's own upstream page size: small, so that it follows continue tokens."""
    monkeypatch.setattr(paging, "PAGE_SIZE", request.param)
    return int(request.param)


async def _hidden_world(upstream: ClaimsUpstream) -> tuple[set[str], list[str]]:
    """Claims around one of the GPU driver's: (visible names, hidden names and uids)."""
    visible = {(await upstream.create("gpu-here", GPU))["metadata"]["name"]}
    secrets: list[str] = []
    for i in range(4):
        for name, driver, node in (
            (f"secret-nic-{i}", NIC, NODE),
            (f"secret-elsewhere-{i}", GPU, "node-b"),
            (f"secret-unallocated-{i}", None, NODE),
        ):
            created = await upstream.create(name, driver, node)
            secrets += [name, created["metadata"]["uid"]]
    return visible, secrets


async def test_a_driver_paging_with_limit_1_learns_nothing_of_hidden_claims(
    claims_upstream: ClaimsUpstream, page_size: int, apiserver: APIServer, policy: Any, pki: Any
) -> None:
    """The issue's attack: limit=1, then continue, repeated, in a namespace full of claims
    hidden from the driver. Every byte the driver gets back, across lists (plain, Table,
    metadata-only, all namespaces), HEAD, tokens it forged or stole, gets of hidden names and
    a watch primed at the list's version, is searched for the hidden names and uids."""
    upstream = claims_upstream
    visible, secrets = await _hidden_world(upstream)
    claims = f"/apis/resource.k8s.io/v1/namespaces/{upstream.namespace}/resourceclaims"
    async with upstream.session() as admin, admin.get(f"{claims}?limit=1") as direct:
        stolen = (await direct.json())["metadata"]["continue"]  # names a hidden claim
    received: list[bytes] = []
    forwarding = UpstreamSession(UpstreamConfig(server=upstream.url, token=upstream.token))
    async with (
        running_gatekeeper(apiserver, policy, pki, upstream=forwarding) as running,
        running.unix_session(GPU) as driver,
    ):

        async def get(target: str, **headers: str) -> tuple[int, Any]:
            async with driver.get(target, headers=headers) as response:
                raw = await response.read()
                received.append(str(response.headers).encode() + raw)
                return response.status, json.loads(raw) if raw else None

        async def get_named(name: str) -> Any:
            """A get by name: the answer names what the driver asked for, and nothing else."""
            async with driver.get(f"{claims}/{name}") as response:
                assert response.status == 404
                status = await response.json()
                received.append(json.dumps(status).replace(name, "NAME").encode())
                return json.loads(json.dumps(status).replace(name, "NAME"))

        for accept in ("", TABLE, PARTIAL):
            for where in (claims, ALL_CLAIMS):
                code, listing = await get(
                    f"{where}?limit=1", **({"Accept": accept} if accept else {})
                )
                assert code == 200 and listing["kind"] == "ResourceClaimList"
                assert {item["metadata"]["name"] for item in listing["items"]} == visible
                assert set(listing["metadata"]) == {"resourceVersion"}
        rv = listing["metadata"]["resourceVersion"]
        for token in (stolen, encode_continue(int(rv), f"/{upstream.namespace}/secret-nic-0\x00")):
            code, status = await get(f"{claims}?limit=1&continue={quote(token)}")
            assert code == 400 and status["message"].startswith("continue is not accepted")
        async with driver.head(f"{claims}?limit=1") as head:
            received.append(str(head.headers).encode() + await head.read())
        absent = await get_named("never-was")
        for name in ("secret-nic-0", "secret-elsewhere-0", "secret-unallocated-0"):
            assert await get_named(name) == absent  # hidden reads exactly as absent
        watch_target = f"{claims}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"
        async with driver.get(watch_target) as watch:
            await upstream.create("secret-later", NIC)
            await upstream.create("gpu-later", GPU)
            seen = []
            while "gpu-later" not in seen:  # after every hidden event that came before it
                line = await asyncio.wait_for(watch.content.readline(), 10)
                assert line, "the watch ended"
                received.append(line)
                event = json.loads(line)
                seen.append(event["object"]["metadata"].get("name"))
    everything = b"".join(received)
    for secret in [*secrets, "secret-later"]:
        assert secret.encode() not in everything, secret


async def test_an_expired_list_version_is_a_plain_410(
    apiserver: APIServer, gatekeeper: Running
) -> None:
    """A 410 of the upstream reaches the driver as a Status with nothing but its code, reason,
    message and details (an expired continue token's 410 carries a new token in metadata)."""
    upstream = ClaimsUpstream(apiserver.url, NODE_TOKEN, "tenant-a")
    await upstream.create("gpu-here", GPU)
    apiserver.compact()
    claims = "/apis/resource.k8s.io/v1/namespaces/tenant-a/resourceclaims"
    async with gatekeeper.unix_session(GPU) as driver:
        response = await driver.get(f"{claims}?resourceVersion=1&resourceVersionMatch=Exact")
        status = await response.json()
    assert response.status == 410 and status["reason"] == "Expired"
    assert status["metadata"] == {} and set(status) == {
        "kind", "apiVersion", "metadata", "status", "message", "reason", "code"
    }  # fmt: skip


def test_an_error_status_keeps_only_what_a_client_reads() -> None:
    expired = status_body(410, "The provided continue parameter is too old", reason="Expired")
    expired["metadata"] = {"continue": "eyJzdGFydCI6Ii90ZW5hbnQvc2VjcmV0In0"}
    expired["details"] = {"causes": [{"message": "m"}], "uid": "u-secret"}
    scrubbed = json.loads(filtering.scoped_error(json.dumps(expired).encode(), 410))
    assert scrubbed["metadata"] == {} and scrubbed["details"] == {"causes": [{"message": "m"}]}
    assert scrubbed["code"] == 410 and scrubbed["message"] == expired["message"]
    garbage = json.loads(filtering.scoped_error(b"<html>secret-nic-0</html>", 502))
    assert garbage["code"] == 502 and "secret" not in json.dumps(garbage)


def test_bookmarks_and_errors_are_rebuilt() -> None:
    state = WatchFilter(keep)
    bookmark = {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {
            "name": "secret",
            "resourceVersion": "12",
            "annotations": {"k8s.io/initial-events-end": "true", "x": "secret"},
        },
        "status": {"secret": True},
    }
    assert state.event(ev("BOOKMARK", bookmark))["object"] == {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "metadata": {"resourceVersion": "12", "annotations": {"k8s.io/initial-events-end": "true"}},
    }
    error = state.event(
        ev("ERROR", {"code": 410, "message": "too old", "metadata": {"continue": "x"}})
    )
    assert error["object"]["metadata"] == {} and error["object"]["code"] == 410


async def test_the_gatekeeper_follows_the_upstream_pages_itself(
    apiserver: APIServer, gatekeeper: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paging, "PAGE_SIZE", 2)
    upstream = ClaimsUpstream(apiserver.url, NODE_TOKEN, "tenant-a")
    for i in range(5):
        await upstream.create(f"gpu-{i}", GPU if i % 2 else NIC)
    since = len(apiserver.journal)
    claims = "/apis/resource.k8s.io/v1/namespaces/tenant-a/resourceclaims"
    async with gatekeeper.unix_session(GPU) as driver, driver.get(f"{claims}?limit=1") as got:
        listing = await got.json()
    assert [item["metadata"]["name"] for item in listing["items"]] == ["gpu-1", "gpu-3"]
    pages = [parse_qs(entry.query_string) for entry in apiserver.journal[since:]]
    assert [page["limit"] for page in pages] == [["2"], ["2"], ["2"]]
    assert "continue" not in pages[0] and all("continue" in page for page in pages[1:])
