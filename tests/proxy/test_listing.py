"""Filtered lists and watch primes shared by identical requests, end to end: a driver over a real
Unix socket, the embedded API server over real HTTP, its journal counting the upstream pages.

However many identical lists a driver has in flight, the upstream reads the cluster's claims at
most twice (the read running when they arrive, and one after it for all of them), and each
answer is one read's, with that read's resourceVersion."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from urllib.parse import parse_qs

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.policy import Policy
from gatekeeper.proxy import paging
from gatekeeper.testing.harness import GPU, NIC, NODE_TOKEN, PKI, Running, running_gatekeeper
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import Pool, UpstreamResponse, UpstreamSession
from tests.proxy.test_filtering_claims import CLAIMS, Admin, allocation, claim, next_event

LISTS = 12
"""Identical lists in flight at once (the issue measured 12 with ``limit=1``)."""
MINE = [f"gpu-{i}" for i in range(5)]
AGENT = "gpu-informer"


class HeldUpstream(UpstreamSession):
    """A real session whose requests for a later page (``continue``) of a list the test's
    informer (:data:`AGENT`) started wait until ``released``: a read stays in flight, between
    its pages, while the test sends more."""

    def __init__(self, config: UpstreamConfig) -> None:
        super().__init__(config)
        self.released = asyncio.Event()
        self.waiting = 0

    def stream(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        *,
        pool: Pool,
    ) -> AbstractAsyncContextManager[UpstreamResponse]:
        opened = super().stream(method, target, headers, body, pool=pool)
        informer = headers.get("User-Agent") == AGENT
        return self._held(opened) if informer and "continue=" in target else opened

    @asynccontextmanager
    async def _held(
        self, opened: AbstractAsyncContextManager[UpstreamResponse]
    ) -> AsyncIterator[UpstreamResponse]:
        self.waiting += 1
        await self.released.wait()
        self.waiting -= 1
        async with opened as response:
            yield response


def seed(apiserver: APIServer) -> None:
    """Five claims of GPU's on this node among six hidden from it: 11 claims, 6 pages of 2."""
    for name in MINE:
        apiserver.add(claim(name))
    for i in range(3):
        apiserver.add(claim(f"nic-{i}", NIC))
        apiserver.add(claim(f"elsewhere-{i}", GPU, "node-b"))


async def until(check: Callable[[], bool]) -> None:
    """Poll the gatekeeper's state (never a fixed sleep), bounded."""
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the state was not reached")


def list_pages(apiserver: APIServer, since: int, agent: str) -> list[dict[str, list[str]]]:
    """The queries of the claim list pages the upstream served for ``agent``'s requests."""
    return [
        parse_qs(entry.query_string)
        for entry in apiserver.journal[since:]
        if entry.method == "GET"
        and entry.path == CLAIMS
        and entry.headers.get("User-Agent") == agent
        and "watch" not in parse_qs(entry.query_string)
    ]


@pytest.fixture
async def held(
    apiserver: APIServer, policy: Policy, pki: PKI, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Running, HeldUpstream]]:
    monkeypatch.setattr(paging, "PAGE_SIZE", 2)
    seed(apiserver)
    upstream = HeldUpstream(UpstreamConfig(server=apiserver.url, token=NODE_TOKEN))
    async with running_gatekeeper(apiserver, policy, pki, upstream=upstream) as running:
        yield running, upstream


async def test_identical_lists_in_flight_cost_two_reads_whatever_their_number(
    held: tuple[Running, HeldUpstream], apiserver: APIServer
) -> None:
    """12 concurrent ``limit=1`` lists of one driver: the first read, held between its pages,
    and one more for the 11 that arrived meanwhile (12 pages, not 72). The first answer is its
    read's (before a claim added meanwhile), the others the second read's, with its
    resourceVersion; another driver's list is not held behind them."""
    running, upstream = held
    reads = running.server.gatekeeper.filtered_reads
    since = len(apiserver.journal)
    async with running.unix_session(GPU) as gpu, running.unix_session(NIC) as nic:

        async def listed() -> tuple[int, bytes]:
            headers = {"User-Agent": AGENT}
            async with gpu.get(f"{CLAIMS}?limit=1", headers=headers) as response:
                return response.status, await response.read()

        first = asyncio.create_task(listed())
        await until(lambda: upstream.waiting == 1)  # its first page read: its version is set
        before = apiserver.objects("resource.k8s.io", "resourceclaims")
        version_before = max(int(c["metadata"]["resourceVersion"]) for c in before)
        late = apiserver.add(claim("gpu-late"))
        later = [asyncio.create_task(listed()) for _ in range(LISTS - 1)]
        await until(lambda: reads.waiting() == (1, LISTS - 1))
        async with nic.get(CLAIMS) as other:  # NIC's own read, not behind GPU's
            assert other.status == 200
            assert [i["metadata"]["name"] for i in (await other.json())["items"]] == [
                "nic-0", "nic-1", "nic-2"
            ]  # fmt: skip
        upstream.released.set()
        answers = [await first, *await asyncio.gather(*later)]
    assert {status for status, _ in answers} == {200}
    pages = list_pages(apiserver, since, AGENT)
    assert sum("continue" not in page for page in pages) == 2  # two reads began
    assert len(pages) == 6 + 6  # 11 claims, then 12, in pages of 2
    assert all(page["limit"] == ["2"] for page in pages)
    documents = [json.loads(body) for _, body in answers]
    assert [i["metadata"]["name"] for i in documents[0]["items"]] == MINE
    assert documents[0]["metadata"] == {"resourceVersion": str(version_before)}
    assert len({body for _, body in answers[1:]}) == 1  # one read's answer, byte for byte
    assert [i["metadata"]["name"] for i in documents[1]["items"]] == [*MINE, "gpu-late"]
    assert documents[1]["metadata"] == {"resourceVersion": late["metadata"]["resourceVersion"]}
    assert reads.started == 3 and reads.waiting() == (0, 0) and len(reads) == 0


async def test_a_list_at_a_version_joins_the_running_read(
    held: tuple[Running, HeldUpstream], apiserver: APIServer
) -> None:
    """A list at a resourceVersion takes any state not older: the read running for the same
    list answers it, although a claim was added after that read began. A list of the newest
    state is another list: its own read, which shows the claim."""
    running, upstream = held
    reads = running.server.gatekeeper.filtered_reads
    async with running.unix_session(GPU) as gpu:

        async def listed(query: str = "") -> dict[str, Any]:
            async with gpu.get(f"{CLAIMS}{query}", headers={"User-Agent": AGENT}) as response:
                assert response.status == 200
                return dict(await response.json())

        async with gpu.get(CLAIMS) as response:
            version = (await response.json())["metadata"]["resourceVersion"]
        at_version = f"?resourceVersion={version}"
        first = asyncio.create_task(listed(at_version))
        await until(lambda: upstream.waiting == 1)
        apiserver.add(claim("gpu-late"))
        joined = asyncio.create_task(listed(at_version))
        newest = asyncio.create_task(listed())
        await until(lambda: reads.waiting() == (3, 0))
        started = reads.started
        upstream.released.set()
        answers = [await first, await joined, await newest]
    assert answers[0] == answers[1] and reads.started == started
    assert "gpu-late" not in {i["metadata"]["name"] for i in answers[0]["items"]}
    assert "gpu-late" in {i["metadata"]["name"] for i in answers[2]["items"]}


async def test_watches_continuing_one_list_share_its_prime(
    held: tuple[Running, HeldUpstream], apiserver: APIServer
) -> None:
    """Five watches from one list's resourceVersion re-read that list once, together; each
    knows what the list showed (a claim of it that leaves scope is sent as DELETED)."""
    running, upstream = held
    reads = running.server.gatekeeper.filtered_reads
    admin = Admin(apiserver)
    async with running.unix_session(GPU) as gpu:
        async with gpu.get(CLAIMS) as listed:
            version = (await listed.json())["metadata"]["resourceVersion"]
        since = len(apiserver.journal)

        async def watched() -> tuple[str, str]:
            target = f"{CLAIMS}?watch=true&resourceVersion={version}&timeoutSeconds=30"
            async with gpu.get(target, headers={"User-Agent": AGENT}) as watch:
                assert watch.status == 200
                kind, name, _ = await next_event(watch)
                return kind, name

        watches = [asyncio.create_task(watched()) for _ in range(5)]
        await until(lambda: upstream.waiting == 1 and reads.waiting() == (5, 0))
        upstream.released.set()
        await admin.put_status("gpu-0", {"allocation": allocation(NIC)})  # leaves GPU's scope
        assert await asyncio.gather(*watches) == [("DELETED", "gpu-0")] * 5
    primes = list_pages(apiserver, since, AGENT)
    assert sum("continue" not in page for page in primes) == 1
    assert primes[0]["resourceVersionMatch"] == ["Exact"] and len(primes) == 6
