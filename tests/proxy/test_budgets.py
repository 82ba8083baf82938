"""Per-driver isolation over real sockets: budgets of in-flight requests and open watches
(429 + Retry-After, audited), upstream pools that keep the gatekeeper's own reads and other
drivers' requests from waiting behind one driver's watches, and bounded waits (503)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp

from gatekeeper.apiserver import APIServer
from gatekeeper.limits import Limits
from gatekeeper.policy import Policy
from gatekeeper.testing.harness import (
    GPU,
    NIC,
    NODE,
    PKI,
    MockResponse,
    MockUpstream,
    RecordingSink,
    Running,
    UpstreamCall,
    running_gatekeeper,
    seed,
    slice_body,
)
from gatekeeper.upstream.session import UpstreamSession

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MIB = 1024 * 1024
# A list at a resourceVersion the store has not reached waits (the apiserver: 3 s, then 504):
# a request that stays in flight, with nothing slow about the gatekeeper itself.
FUTURE = {"resourceVersion": "999999", "resourceVersionMatch": "NotOlderThan"}


def pinned(driver: str, **extra: str) -> dict[str, str]:
    return {"fieldSelector": f"spec.nodeName={NODE},spec.driver={driver}", **extra}


@asynccontextmanager
async def started(
    apiserver: APIServer, policy: Policy, pki: PKI, limits: Limits
) -> AsyncIterator[tuple[Running, RecordingSink]]:
    apiserver.rv_wait_seconds = 5.0
    sink = RecordingSink()
    async with running_gatekeeper(apiserver, policy, pki, audit_sink=sink, limits=limits) as gk:
        yield gk, sink


@asynccontextmanager
async def holding(
    gk: Running, session: aiohttp.ClientSession, count: int, **params: str
) -> AsyncIterator[list[asyncio.Task[int]]]:
    """``count`` requests of ``session`` kept open (watches, or lists that wait), returned once
    the gatekeeper holds an upstream connection for each of them."""

    async def one() -> int:
        async with session.get(SLICES, params=params) as response:
            await response.read()
            return response.status

    upstream = gk.server.upstream
    assert isinstance(upstream, UpstreamSession)
    pool = upstream.pools["watches" if params.get("watch") else "requests"]
    before = pool.in_use
    tasks = [asyncio.create_task(one()) for _ in range(count)]
    await _until(lambda: pool.in_use >= before + count)
    try:
        yield tasks
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_over_the_watch_budget_is_429_and_audited(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    async with (
        started(apiserver, policy, pki, Limits(watches_per_driver=3)) as (gk, sink),
        gk.unix_session(GPU) as gpu,
        gk.unix_session(NIC) as nic,
        holding(gk, gpu, 3, **pinned(GPU, watch="true")) as watches,
    ):
        async with gpu.get(SLICES, params=pinned(GPU, watch="true")) as refused:
            assert refused.status == 429
            assert refused.headers["Retry-After"] == "1"
            status = await refused.json()
            assert status["details"]["retryAfterSeconds"] == 1
            assert "3 open watches" in status["message"]
            (event,) = sink.by_id(refused.headers["Audit-Id"])
            assert event["annotations"]["authorization.k8s.io/decision"] == "forbid"
        assert not any(task.done() for task in watches)
        # Another driver's budget is its own; the first driver's requests still pass.
        async with nic.get(SLICES, params=pinned(NIC, watch="true", timeoutSeconds="1")) as ok:
            assert ok.status == 200
        async with gpu.get(SLICES, params=pinned(GPU)) as listed:
            assert listed.status == 200


async def test_over_the_inflight_budget_is_429_other_driver_served(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    async with (
        started(apiserver, policy, pki, Limits(inflight_per_driver=2)) as (gk, _),
        gk.unix_session(GPU) as gpu,
        gk.unix_session(NIC) as nic,
        holding(gk, gpu, 2, **pinned(GPU, **FUTURE)),
    ):
        async with gpu.get("/version") as refused:
            assert refused.status == 429 and refused.headers["Retry-After"] == "1"
        async with nic.get("/version") as served:
            assert served.status == 200


async def test_own_reads_never_wait_behind_drivers_watches(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """Every upstream watch connection held by one driver: the gatekeeper's own fetch (before
    deciding a get) and other drivers' requests still go through; one more watch waits at
    most --upstream-wait, then 503 + Retry-After."""
    seed(apiserver, name="nic-slice", driver=NIC, pool=NODE)
    limits = Limits(upstream_watches=4, watches_per_driver=8, upstream_wait=0.5)
    async with (
        started(apiserver, policy, pki, limits) as (gk, _),
        gk.unix_session(GPU) as gpu,
        gk.unix_session(NIC) as nic,
        holding(gk, gpu, 4, **pinned(GPU, watch="true")),
    ):
        async with nic.get(f"{SLICES}/nic-slice") as fetched:
            assert fetched.status == 200  # the engine's read used the gatekeeper's own pool
        async with nic.get(SLICES, params=pinned(NIC)) as listed:
            assert listed.status == 200
        async with nic.get(SLICES, params=pinned(NIC, watch="true")) as waited:
            assert waited.status == 503
            assert waited.headers["Retry-After"] == "1"
            assert "no upstream connection for drivers' watches" in (await waited.json())["message"]


async def test_waiting_for_a_request_connection_is_bounded(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    limits = Limits(upstream_requests=2, upstream_wait=0.3)
    async with (
        started(apiserver, policy, pki, limits) as (gk, _),
        gk.unix_session(GPU) as gpu,
        AsyncExitStack() as stack,
    ):
        await stack.enter_async_context(holding(gk, gpu, 2, **pinned(GPU, **FUTURE)))
        async with gpu.get(SLICES, params=pinned(GPU)) as waited:
            assert waited.status == 503 and waited.headers["Retry-After"] == "1"


async def test_an_internal_error_is_a_status_with_audit_id_and_the_decision_so_far(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """A fault after the decision (here: while forwarding) is a 500 Status, not aiohttp's
    text/plain; the event keeps the decision reached (allow) and names the error."""
    sink = RecordingSink()
    async with running_gatekeeper(apiserver, policy, pki, audit_sink=sink) as gk:

        def broken(call: UpstreamCall) -> MockResponse:
            raise RuntimeError("a bug")

        # A pinned list reads nothing first: the forward is the upstream's one call.
        gk.server.gatekeeper.upstream = MockUpstream(broken)
        async with gk.unix_session(GPU) as gpu, gpu.get(SLICES, params=pinned(GPU)) as answer:
            assert answer.status == 500
            assert answer.headers["Content-Type"].startswith("application/json")
            status = await answer.json()
            audit_id = answer.headers["Audit-Id"]
    assert status["kind"] == "Status" and audit_id in status["message"]
    (event,) = sink.by_id(audit_id)
    assert event["responseStatus"]["code"] == 500
    assert event["annotations"]["authorization.k8s.io/decision"] == "allow"
    assert event["annotations"]["dra-gatekeeper.io/error"] == "internal error: RuntimeError"


CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


async def _until(check: Callable[[], bool]) -> None:
    """Poll the gatekeeper's own state until ``check`` holds (bounded)."""
    async with asyncio.timeout(10):
        while not check():
            await asyncio.sleep(0.01)


async def test_a_watch_prime_takes_a_request_of_the_drivers_budget(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """A claim watch continuing a list at a resourceVersion first re-reads that list: a list
    read like any other, so it needs a free request of the driver's in-flight budget."""
    async with (
        started(apiserver, policy, pki, Limits(inflight_per_driver=1)) as (gk, _sink),
        gk.unix_session(GPU) as gpu,
        gk.unix_session(NIC) as nic,
        holding(gk, gpu, 1, **pinned(GPU, **FUTURE)),
    ):
        budgets = gk.server.gatekeeper.budgets
        await _until(lambda: budgets.inflight[GPU] == 1)
        primed = {"watch": "true", "resourceVersion": "1", "timeoutSeconds": "1"}
        async with gpu.get(CLAIMS, params=primed) as refused:
            assert refused.status == 429
            assert "requests in flight" in (await refused.json())["message"]
        assert budgets.watches[GPU] == 0
        async with gpu.get(CLAIMS, params={"watch": "true", "timeoutSeconds": "1"}) as unprimed:
            assert unprimed.status == 200  # nothing to re-read: the watch budget alone
        async with nic.get(CLAIMS, params=primed) as other:
            assert other.status == 200


async def test_filtered_reads_wait_their_turn_per_driver(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """One driver's filtered lists take turns (memory and loop time do not grow with its
    concurrency); past --upstream-wait, 429. Another driver never waits for them."""
    limits = Limits(filtered_reads_per_driver=1, upstream_wait=0.3)
    async with (
        started(apiserver, policy, pki, limits) as (gk, _sink),
        gk.unix_session(GPU) as gpu,
        gk.unix_session(NIC) as nic,
    ):
        budgets = gk.server.gatekeeper.budgets

        async def slow_list() -> int:
            async with gpu.get(CLAIMS, params=FUTURE) as response:  # waits upstream (5 s)
                return response.status

        held = asyncio.create_task(slow_list())
        try:
            await _until(lambda: budgets.filtered_reads(GPU) == 1)
            async with gpu.get(CLAIMS) as refused:
                assert refused.status == 429 and refused.headers["Retry-After"] == "1"
                message = (await refused.json())["message"]
                waited = r"waited [\d.]+ seconds behind its own 1 filtered lists or watch primes"
                assert re.search(waited, message), message
            async with nic.get(CLAIMS) as other:
                assert other.status == 200
            assert budgets.filtered_reads(NIC) == 0
        finally:
            held.cancel()
            await asyncio.gather(held, return_exceptions=True)
        await _until(lambda: budgets.filtered_reads(GPU) == 0)


def _padded(name: str, driver: str, size: int) -> bytes:
    body = slice_body(name, driver=driver, pool=f"{NODE}/{driver}")
    body["metadata"]["annotations"] = {"pad": "p" * size}
    return json.dumps(body).encode()


async def test_a_drivers_bodies_past_its_byte_budget_wait_then_429_others_unaffected(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """A burst of the budget (at least 3 MiB) passes at once; past it a body waits for the
    driver's rate, up to --upstream-wait, then 429, audited. Another driver's budget is its own."""
    limits = Limits(body_kib_per_driver=64, upstream_wait=0.5)
    headers = {"Content-Type": "application/json"}
    async with (
        started(apiserver, policy, pki, limits) as (gk, sink),
        gk.unix_session(GPU) as gpu,
        gk.unix_session(NIC) as nic,
    ):
        for i in range(2):
            async with gpu.post(
                SLICES, data=_padded(f"gpu-{i}", GPU, 5 * MIB // 4), headers=headers
            ) as ok:
                assert ok.status == 201, await ok.text()
        async with gpu.post(
            SLICES, data=_padded("gpu-2", GPU, 5 * MIB // 4), headers=headers
        ) as refused:
            assert refused.status == 429 and refused.headers["Retry-After"] == "1"
            status = await refused.json()
            assert "sends request bodies faster than the 64 KiB a second" in status["message"]
            (event,) = sink.by_id(refused.headers["Audit-Id"])
            assert event["annotations"]["authorization.k8s.io/decision"] == "forbid"
        async with nic.post(SLICES, data=_padded("nic-0", NIC, MIB), headers=headers) as other:
            assert other.status == 201, await other.text()
        # The refused body took nothing: what is left of the budget still holds a small one.
        async with gpu.post(SLICES, data=_padded("gpu-3", GPU, 10), headers=headers) as small:
            assert small.status == 201
    assert apiserver.get("resource.k8s.io", "resourceslices", "gpu-2") is None


async def test_a_chunked_body_is_counted_once_read(
    apiserver: APIServer, policy: Policy, pki: PKI
) -> None:
    """Without a Content-Length the body's size is known once read: it is counted then, and
    the driver's next body waits for it."""
    limits = Limits(body_kib_per_driver=64, upstream_wait=0.5)
    headers = {"Content-Type": "application/json"}

    async def chunked(payload: bytes) -> AsyncIterator[bytes]:
        for start in range(0, len(payload), 65536):
            yield payload[start : start + 65536]

    async with (
        started(apiserver, policy, pki, limits) as (gk, _),
        gk.unix_session(GPU) as gpu,
    ):
        for i in range(2):
            payload = _padded(f"gpu-{i}", GPU, 2 * MIB)
            async with gpu.post(SLICES, data=chunked(payload), headers=headers) as ok:
                assert ok.status == 201, await ok.text()
                assert ok.request_info.headers.get("Content-Length") is None
        async with gpu.post(SLICES, data=_padded("gpu-2", GPU, 10), headers=headers) as refused:
            assert refused.status == 429
