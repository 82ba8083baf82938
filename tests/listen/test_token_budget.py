"""Unauthenticated requests on the token listener cannot make the gatekeeper work without bound:
TokenReviews within a budget (per connection, per address, per process; each driver's share
apart), in their own upstream pool, counted by reason. Counts come from the embedded API
server's journal of TokenReviews, never from timing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.limits import Limits
from gatekeeper.listen.identity import TokenFailure
from gatekeeper.policy import Policy
from gatekeeper.testing.harness import GPU, PINNED, PKI, metric_value, slice_body
from gatekeeper.upstream.session import UpstreamSession
from tests.tokencluster import SA, TokenGatekeeper, call, reviews_of, start, token, token_cluster

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MINE = f"{SLICES}?{PINNED}"
# Every review bucket holds 2 and refills once in 100 s: what a test counts is what the bucket
# held. Refusals are answered at once (their pace has a test of its own).
TIGHT = Limits(
    token_reviews=0.01,
    token_reviews_per_source=0.01,
    token_reviews_per_connection=0.01,
    token_reviews_per_driver=0.01,
    token_refusals_per_connection=10_000,
)


@pytest.fixture
def token_policy(policy: Policy) -> Policy:
    return replace(policy, service_accounts={SA: GPU})


@pytest.fixture
async def cluster(token_policy: Policy) -> AsyncIterator[APIServer]:
    async with token_cluster(token_policy) as api:
        yield api


@pytest.fixture
async def tight(
    cluster: APIServer, token_policy: Policy, pki: PKI
) -> AsyncIterator[TokenGatekeeper]:
    async with start(cluster, token_policy, pki, limits=TIGHT, token_cache_ttl=10.0) as gk:
        yield gk


def failures(gk: TokenGatekeeper, failure: TokenFailure) -> float:
    text = gk.running.server.metrics.render().decode()
    return metric_value(text, "dra_gatekeeper_token_failures_total", reason=failure.value)


async def test_one_connection_of_garbage_costs_its_bucket_in_reviews(
    tight: TokenGatekeeper, cluster: APIServer
) -> None:
    before = len(cluster.journal)
    statuses = []
    async with tight.session() as one:
        for n in range(50):
            status, headers, body = await call(tight, "GET", MINE, f"garbage.{n}.x", session=one)
            statuses.append(status)
    assert reviews_of(cluster, since=before) == 2
    assert statuses == [401] * 2 + [429] * 48
    assert headers["Retry-After"] == "100"
    assert body["details"]["retryAfterSeconds"] == 100
    assert "--max-token-reviews-per-connection" in body["message"]
    (event,) = tight.sink.by_id(headers["Audit-Id"])
    annotations = event["annotations"]
    assert annotations["authorization.k8s.io/decision"] == "forbid"
    assert "--max-token-reviews-per-connection" in annotations["authorization.k8s.io/reason"]
    assert failures(tight, TokenFailure.REJECTED) == 2
    assert failures(tight, TokenFailure.RATE_LIMITED) == 48
    # Another connection from the same address: the address's bucket is used up too.
    status, _, body = await call(tight, "GET", MINE, "garbage.other.x")
    assert status == 429 and "--max-token-reviews-per-source" in body["message"]
    assert reviews_of(cluster, since=before) == 2


async def test_a_rotated_token_is_reviewed_while_garbage_floods(
    tight: TokenGatekeeper, cluster: APIServer
) -> None:
    """A driver's connection keeps its share: the flood (here from the same loopback address,
    which takes the address's share and everyone's) does not delay its rotated token."""
    async with tight.session() as driver:
        assert (await call(tight, "GET", MINE, token(cluster), session=driver))[0] == 200
        before = len(cluster.journal)
        statuses = [(await call(tight, "GET", MINE, f"garbage.{n}.x"))[0] for n in range(20)]
        # The address's share (2), then what the driver's first review left of everyone's (1).
        assert statuses == [401] * 3 + [429] * 17
        assert reviews_of(cluster, since=before) == 3
        rotated = token(cluster)
        status, _, _ = await call(tight, "GET", MINE, rotated, session=driver)
        assert status == 200 and reviews_of(cluster, rotated) == 1
        # A new token on a new connection is the flood's: refused.
        assert (await call(tight, "GET", MINE, token(cluster)))[0] == 429


async def test_a_drivers_expired_answer_is_reviewed_again_from_its_share(
    cluster: APIServer, token_policy: Policy, pki: PKI
) -> None:
    async with start(cluster, token_policy, pki, limits=TIGHT, token_cache_ttl=0.05) as gk:
        secret = token(cluster)
        assert (await call(gk, "GET", MINE, secret))[0] == 200
        for n in range(10):  # everyone's budget used up
            await call(gk, "GET", MINE, f"garbage.{n}.x")
        assert (await call(gk, "GET", MINE, "garbage.more.x"))[0] == 429
        statuses = set()
        async with gk.session() as again:
            for _ in range(5000):  # until the cached answer expired and was asked for again
                statuses.add((await call(gk, "GET", MINE, secret, session=again))[0])
                if reviews_of(cluster, secret) == 2:
                    break
        assert reviews_of(cluster, secret) == 2 and statuses == {200}


async def test_reviews_wait_for_their_own_pool_only(
    cluster: APIServer, token_policy: Policy, pki: PKI
) -> None:
    """Every review connection held: a new token waits (then 503), while a driver whose token
    is cached creates (forwarded) and reads (the gatekeeper's own fetch) a slice."""
    limits = Limits(upstream_reviews=2, upstream_wait=0.3)
    async with start(cluster, token_policy, pki, limits=limits, token_cache_ttl=10.0) as gk:
        secret = token(cluster)
        assert (await call(gk, "GET", MINE, secret))[0] == 200
        upstream = gk.running.server.upstream
        assert isinstance(upstream, UpstreamSession)
        reviews = upstream.pools["reviews"]
        async with reviews.slot(1.0), reviews.slot(1.0):
            status, headers, body = await call(gk, "GET", MINE, token(cluster))
            assert status == 503 and headers["Retry-After"] == "1"
            assert "token reviews" in body["message"]
            assert (await call(gk, "POST", SLICES, secret, slice_body()))[0] == 201
            assert (await call(gk, "GET", f"{SLICES}/node-a-gpu-0", secret))[0] == 200
        assert failures(gk, TokenFailure.REVIEW_UNAVAILABLE) == 1


async def test_every_failure_reason_is_a_series_from_the_start(tight: TokenGatekeeper) -> None:
    assert [failures(tight, failure) for failure in TokenFailure] == [0] * len(TokenFailure)
    assert (await call(tight, "GET", MINE, None))[0] == 401
    assert failures(tight, TokenFailure.NO_BEARER) == 1


async def test_refusals_on_one_connection_are_answered_at_their_pace(
    cluster: APIServer, token_policy: Policy, pki: PKI
) -> None:
    """10 per second after a burst of 10: 20 refusals on one connection take at least 1 s from
    the first request to the last answer (a lower bound: load only adds to it)."""
    limits = replace(TIGHT, token_refusals_per_connection=10)
    async with start(cluster, token_policy, pki, limits=limits) as gk, gk.session() as one:
        ids = [(await call(gk, "GET", MINE, None, session=one))[1]["Audit-Id"] for _ in range(20)]
        (first,), (last,) = gk.sink.by_id(ids[0]), gk.sink.by_id(ids[-1])
        assert _at(last["stageTimestamp"]) - _at(first["requestReceivedTimestamp"]) >= 0.99
        assert failures(gk, TokenFailure.NO_BEARER) == 20


def _at(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
