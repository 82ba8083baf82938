"""The TokenReview exchange against the embedded API server over HTTP: the answer read as the
apiserver gives it, audiences asked for, and every failure upstream a 503 (fail closed)."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from gatekeeper.apiserver import APIServer
from gatekeeper.errors import UpstreamError
from gatekeeper.policy import Policy
from gatekeeper.testing.harness import GPU, NODE, NODE_TOKEN
from gatekeeper.upstream.kubeconfig import UpstreamConfig
from gatekeeper.upstream.session import UpstreamSession
from gatekeeper.upstream.tokenreview import ReviewOutcome, review_token
from tests.tokencluster import SA, reviews_of, token, token_cluster


@pytest.fixture
async def cluster(policy: Policy) -> AsyncIterator[APIServer]:
    async with token_cluster(replace(policy, service_accounts={SA: GPU})) as api:
        yield api


async def _session(server: str, token: str = NODE_TOKEN) -> UpstreamSession:
    upstream = UpstreamSession(UpstreamConfig(server=server, token=token))
    await upstream.start()
    return upstream


async def test_a_bound_token_is_its_service_account_on_its_node(cluster: APIServer) -> None:
    upstream = await _session(cluster.url)
    try:
        outcome = await review_token(upstream, token(cluster))
    finally:
        await upstream.close()
    assert outcome.authenticated and outcome.username == SA
    assert outcome.extra["authentication.kubernetes.io/node-name"] == (NODE,)
    assert "system:serviceaccounts" in outcome.groups


async def test_a_rejected_token_carries_the_apiservers_reason(cluster: APIServer) -> None:
    upstream = await _session(cluster.url)
    try:
        outcome = await review_token(upstream, "garbage.token.here")
        other = await review_token(upstream, token(cluster), audiences=("elsewhere",))
    finally:
        await upstream.close()
    assert not outcome.authenticated and outcome.error
    assert not other.authenticated and "audience" in other.error
    assert reviews_of(cluster) == 2


async def test_no_answer_is_a_503_naming_the_review(cluster: APIServer) -> None:
    """The gatekeeper's own credentials refused (as a missing RBAC rule is), or no apiserver
    at all: UpstreamError 503, never an answer about the token."""
    refused = await _session(cluster.url, token="not-the-node-token")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"https://127.0.0.1:{probe.getsockname()[1]}"
    unreachable = await _session(closed)
    try:
        for upstream, words in ((refused, "HTTP 401"), (unreachable, "cannot review")):
            with pytest.raises(UpstreamError) as failed:
                await review_token(upstream, token(cluster))
            assert failed.value.code == 503 and words in failed.value.message
            assert "the driver's token" in failed.value.message
    finally:
        await refused.close()
        await unreachable.close()


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (None, ReviewOutcome(False, error="the TokenReview answer has no status")),
        ({"authenticated": "yes"}, ReviewOutcome(False)),
        ({"authenticated": True, "user": "x"}, ReviewOutcome(True)),
        (
            {"authenticated": True, "user": {"username": "u", "extra": {"k": ["v"], "bad": "v"}}},
            ReviewOutcome(True, "u", extra={"k": ("v",)}),
        ),
    ],
    ids=["no-status", "not-a-bool", "user-not-an-object", "extra-not-a-list"],
)
def test_an_answer_of_the_wrong_shape_authenticates_nobody_it_does_not_say(
    status: object, outcome: ReviewOutcome
) -> None:
    assert ReviewOutcome.from_status(status) == outcome
