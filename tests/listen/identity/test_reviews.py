"""The token reviewer's cache against the embedded API server over HTTP: drivers' entries apart from
every other answer (no flood of garbage evicts one), an answer's life counted from when its
review was sent, and the review budget asked only for reviews not yet cached."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.limits import Limits
from gatekeeper.listen.identity import (
    ReviewBudget,
    ReviewCaller,
    TokenRefusal,
    TokenReviewer,
    token_driver,
)
from gatekeeper.policy import Policy
from gatekeeper.testing.harness import GPU, NODE, NODE_TOKEN
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import UpstreamSession
from gatekeeper.upstream.tokenreview import ReviewOutcome, review_token
from tests.tokencluster import SA, reviews_of, token, token_cluster

# Far more than any test here asks: only the caches are under test unless a test says.
OPEN = Limits(
    token_reviews=10_000,
    token_reviews_per_source=10_000,
    token_reviews_per_connection=10_000,
)


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def token_policy(policy: Policy) -> Policy:
    return replace(policy, service_accounts={SA: GPU})


@pytest.fixture
async def cluster(token_policy: Policy) -> AsyncIterator[APIServer]:
    async with token_cluster(token_policy) as api:
        yield api


@pytest.fixture
async def session(cluster: APIServer) -> AsyncIterator[UpstreamSession]:
    upstream = UpstreamSession(UpstreamConfig(server=cluster.url, token=NODE_TOKEN))
    await upstream.start()
    yield upstream
    await upstream.close()


def reviewer(
    session: UpstreamSession,
    policy: Policy,
    clock: Clock,
    limits: Limits = OPEN,
    *,
    slow: float = 0.0,
    **options: Any,
) -> TokenReviewer:
    """A reviewer asking ``session``'s API server; ``slow``: seconds the clock moves while
    each review is on its way (an apiserver that takes that long to answer)."""

    async def review(token: str) -> ReviewOutcome:
        clock.now += slow
        return await review_token(session, token)

    def driver_of(outcome: ReviewOutcome) -> str | None:
        return token_driver(outcome, policy, NODE)

    return TokenReviewer(
        review,
        budget=ReviewBudget(limits, clock=clock),
        driver_of=driver_of,
        clock=clock,
        **options,
    )


def caller() -> ReviewCaller:
    return ReviewCaller("10.0.0.1")


async def test_no_flood_of_other_answers_evicts_a_drivers_entry(
    cluster: APIServer, session: UpstreamSession, token_policy: Policy
) -> None:
    reviews = reviewer(session, token_policy, Clock(), ttl=60, negative_ttl=60, max_refused=16)
    secret = token(cluster)
    assert (await reviews.review(secret, caller())).authenticated
    # 200 tokens that are no driver's: garbage, and valid tokens of an unmapped account.
    strangers = [f"garbage.{n}.token" for n in range(190)]
    strangers += [token(cluster, pod="other-a", account="other") for _ in range(10)]
    before = len(cluster.journal)
    for stranger in strangers:
        await reviews.review(stranger, caller())
    assert reviews_of(cluster, since=before) == 200
    assert len(reviews) <= 1 + 16
    # The driver's answer is still cached: no review of its token since the first.
    assert (await reviews.review(secret, caller())).authenticated
    assert reviews_of(cluster, secret) == 1


async def test_drivers_entries_are_bounded_too(
    cluster: APIServer, session: UpstreamSession, token_policy: Policy
) -> None:
    reviews = reviewer(session, token_policy, Clock(), ttl=60, max_valid=3)
    secrets = [token(cluster) for _ in range(5)]
    for secret in secrets:
        await reviews.review(secret, caller())
    assert len(reviews) == 3
    await reviews.review(secrets[0], caller())  # the least recently used went first
    assert reviews_of(cluster, secrets[0]) == 2 and reviews_of(cluster, secrets[4]) == 1


async def test_an_answer_lives_ttl_from_when_its_review_was_sent(
    cluster: APIServer, session: UpstreamSession, token_policy: Policy
) -> None:
    """The apiserver accepted the token when it read the review: the gatekeeper accepts it at
    most ``ttl`` after that, however long the answer took to arrive (here 1.5 s)."""
    clock = Clock()
    reviews = reviewer(session, token_policy, clock, ttl=2.0, slow=1.5)
    secret = token(cluster)
    sent = clock.now
    assert (await reviews.review(secret, caller())).authenticated
    cluster.store.delete(("", "pods"), ("gpu-system", "plugin-a"))  # the token is now invalid
    clock.now = sent + 1.99
    assert (await reviews.review(secret, caller())).authenticated  # the cached answer
    assert reviews_of(cluster, secret) == 1
    clock.now = sent + 2.0
    outcome = await reviews.review(secret, caller())
    assert not outcome.authenticated and "invalidated" in outcome.error
    assert reviews_of(cluster, secret) == 2


async def test_never_past_the_tokens_exp(
    cluster: APIServer, session: UpstreamSession, token_policy: Policy
) -> None:
    clock, wall = Clock(), Clock()
    reviews = reviewer(session, token_policy, clock, ttl=10.0, wall_clock=wall)
    secret = token(cluster, seconds=3600)
    wall.now = time.time() + 3599.5  # as the gatekeeper's clock sees it: 0.5 s of life left
    assert (await reviews.review(secret, caller())).authenticated
    clock.now += 0.5
    assert (await reviews.review(secret, caller())).authenticated  # asked again
    assert reviews_of(cluster, secret) == 2


async def test_only_reviews_not_yet_cached_take_the_budget(
    cluster: APIServer, session: UpstreamSession, token_policy: Policy
) -> None:
    tight = Limits(
        token_reviews=0.01,
        token_reviews_per_source=0.01,
        token_reviews_per_connection=0.01,
    )
    reviews = reviewer(session, token_policy, Clock(), tight, ttl=60)
    one = caller()
    secret = token(cluster)
    # 20 requests at once with one new token: one review, none refused.
    answers = await asyncio.gather(*(reviews.review(secret, one) for _ in range(20)))
    assert all(a.authenticated for a in answers) and reviews_of(cluster, secret) == 1
    for _ in range(50):  # cached: never counted
        assert (await reviews.review(secret, one)).authenticated
    assert (await reviews.review("garbage.1.x", one)).error
    with pytest.raises(TokenRefusal) as refused:  # the connection's bucket (2) is used up
        await reviews.review("garbage.2.x", one)
    assert refused.value.code == 429
    assert reviews_of(cluster) == 2


async def test_a_drivers_token_is_asked_about_again_from_its_share(
    cluster: APIServer, session: UpstreamSession, token_policy: Policy
) -> None:
    """Everyone else's budget used up: the driver's own token, its answer expired, is still
    reviewed (the driver's share), and so is a rotated token on the driver's connection."""
    clock = Clock()
    tight = Limits(token_reviews=0.01, token_reviews_per_source=0.01)
    reviews = reviewer(session, token_policy, clock, tight, ttl=2.0)
    driver = caller()
    secret = token(cluster)
    assert (await reviews.review(secret, driver)).authenticated
    for n in range(10):  # the flood, each from an address of its own
        with contextlib.suppress(TokenRefusal):
            await reviews.review(f"garbage.{n}.x", ReviewCaller(f"10.9.0.{n}"))
    with pytest.raises(TokenRefusal):
        await reviews.review("garbage.new.x", ReviewCaller("10.9.1.1"))
    clock.now += 2.0  # the driver's answer expired
    assert (await reviews.review(secret, ReviewCaller("10.9.2.2"))).authenticated
    assert reviews_of(cluster, secret) == 2
    rotated = token(cluster)
    assert (await reviews.review(rotated, driver)).authenticated
    assert reviews_of(cluster, rotated) == 1


async def test_a_token_that_is_no_longer_a_drivers_loses_the_share(
    cluster: APIServer, session: UpstreamSession, token_policy: Policy
) -> None:
    clock = Clock()
    tight = Limits(
        token_reviews=0.01, token_reviews_per_source=0.01, token_reviews_per_connection=0.01
    )
    reviews = reviewer(session, token_policy, clock, tight, ttl=2.0, negative_ttl=2.0)
    secret = token(cluster)
    assert (await reviews.review(secret, caller())).authenticated
    assert (await reviews.review("garbage.1.x", ReviewCaller("10.8.0.1"))).error
    cluster.store.delete(("", "pods"), ("gpu-system", "plugin-a"))
    clock.now += 2.0  # asked again from the driver's share: now rejected
    assert not (await reviews.review(secret, ReviewCaller("10.8.0.2"))).authenticated
    clock.now += 2.0  # that answer expired too: the token is everyone's now, and none is left
    with pytest.raises(TokenRefusal):
        await reviews.review(secret, ReviewCaller("10.8.0.3"))
    assert reviews_of(cluster, secret) == 2
