"""The steps before forwarding: who is calling, and the engine's conversation driven with the
driver's request and the upstream as its readers."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gatekeeper.audit.flow import Client, Flow
from gatekeeper.errors import Refusal, UpstreamError
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy.conversation import Answer, Body, Fetch, conversation
from gatekeeper.policy.decision import Decision
from gatekeeper.proxy.requestbody import read_body
from gatekeeper.proxy.state import Gatekeeper
from gatekeeper.proxy.tokens import TokenFailure, TokenRefusal, bearer_token, token_identity
from gatekeeper.request.headers import accepts_plain_json
from gatekeeper.types import Identity
from gatekeeper.upstream.previews import run_preview
from gatekeeper.upstream.reviewbudget import ReviewCaller
from gatekeeper.upstream.session import fetch
from gatekeeper.upstream.tokenreview import TokenReviewer

__all__ = ["Connection", "decide", "identify_request"]


class Connection:
    """The pipeline's view of the connection a request came on: the listeners' connections
    (:mod:`gatekeeper.listen.connections`) are ones, and set all three members when made."""

    __slots__ = ()

    client: Client | None = None
    """Who the connection is, known when it was made."""
    reviews: ReviewCaller
    """The connection in the token listener's review budget (its address, its buckets)."""

    def attribute(self, driver: str) -> str | None:
        """Count a token listener's connection as ``driver``'s from now on: None, or why it
        is refused (over the driver's connection caps)."""
        raise NotImplementedError


async def identify_request(request: web.BaseRequest, gk: Gatekeeper) -> Identity:
    """Who is calling: the identity its connection was given when it was made (the socket
    directory, the verified client certificate), or on the token listener the service account
    of the request's bearer token (reviewed, cached), whose connection is then counted as that
    driver's (docs/operating.md#limits)."""
    connection = request.protocol
    if not isinstance(connection, Connection) or connection.client is None:
        raise Refusal(401, "connection not identified", "Unauthorized: no identity")
    client = connection.client
    if client.listener is not ListenerKind.TOKEN:
        if client.identity is None:
            assert client.refusal is not None
            raise client.refusal
        return client.identity
    if gk.tokens is None:
        raise Refusal(401, "no token reviewer", "Unauthorized: no identity")
    try:
        identity = await _token_identity(request, connection, gk.tokens, gk)
    except TokenRefusal as refusal:
        gk.token_failed(refusal.failure)
        # SECURITY: docs/security.md "The token listener" — refusals on one connection are
        # answered at a bounded rate, so that one keep-alive connection cannot make the
        # gatekeeper answer without bound.
        if (hold := gk.tokens.budget.pace(connection.reviews)) > 0:
            await asyncio.sleep(hold)
        raise
    except UpstreamError:
        gk.token_failed(TokenFailure.REVIEW_UNAVAILABLE)
        raise
    if why := connection.attribute(identity.driver):
        raise Refusal(429, "too many connections", f"too many connections: {why}", retry_after=1)
    return identity


async def _token_identity(
    request: web.BaseRequest, connection: Connection, tokens: TokenReviewer, gk: Gatekeeper
) -> Identity:
    # SECURITY: DESIGN §4.2, docs/security.md "The token listener" — a token not cached is
    # reviewed only within the caller's budget (its connection, its address, the process).
    outcome = await tokens.review(bearer_token(request.headers), connection.reviews)
    return token_identity(outcome, gk.engine.policy, gk.node_name)


async def decide(request: web.BaseRequest, flow: Flow, gk: Gatekeeper) -> Decision:
    """The engine's conversation (:mod:`gatekeeper.policy.conversation`), its readers the
    driver's request body and the upstream; what they read is kept on ``flow`` for the audit."""
    assert flow.identity is not None and flow.info is not None
    plain_json = accepts_plain_json(request.headers.get("Accept", ""))
    talk = conversation(gk.engine, flow.identity, flow.info, plain_json=plain_json)
    answer: Answer = None
    try:
        while True:
            step = talk.send(answer)
            if isinstance(step, Body):
                timeout = gk.budgets.limits.body_timeout
                flow.media_type, flow.body = await read_body(request, flow.info, timeout)
                answer = (flow.media_type, flow.body)
            elif isinstance(step, Fetch):
                flow.current = answer = await fetch(gk.upstream, step.path)
            else:
                flow.proposed = answer = await run_preview(gk.upstream, step)
    except StopIteration as done:
        decision: Decision = done.value
        return decision
