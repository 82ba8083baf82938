"""Who is calling, for every listener: the :class:`Identifier` decides it once per connection
(a socket's directory, a verified certificate's CN) or, on the token listener, per request
(the bearer token's service account, reviewed and cached), and is the one place the pipeline
asks (:func:`~gatekeeper.proxy.pipeline.build_handler`'s ``identify``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gatekeeper.audit.flow import Client
from gatekeeper.errors import Refusal, UpstreamError
from gatekeeper.limits import Limits
from gatekeeper.listen.identity._budget import ReviewBudget, ReviewCaller
from gatekeeper.listen.identity._failures import TokenFailure, TokenRefusal
from gatekeeper.listen.identity._peers import identify
from gatekeeper.listen.identity._reviews import TokenReviewer
from gatekeeper.listen.identity._tokens import shown_token, token_driver, token_identity
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.proxy.state import Gatekeeper
from gatekeeper.types import Identity
from gatekeeper.upstream.session import Upstream
from gatekeeper.upstream.tokenreview import ReviewOutcome, review_token

__all__ = ["Connection", "Identifier", "token_reviewer"]


class Connection:
    """What the identifier needs of the connection a request came on: the listeners'
    connections (:mod:`gatekeeper.listen.connections`) are ones, and set all three members
    when made."""

    __slots__ = ()

    client: Client | None = None
    """Who the connection is, known when it was made."""
    reviews: ReviewCaller
    """The connection in the token listener's review budget (its address, its buckets)."""

    def attribute(self, driver: str) -> str | None:
        """Count a token listener's connection as ``driver``'s from now on: None, or why it
        is refused (over the driver's connection caps)."""
        raise NotImplementedError


def token_reviewer(
    upstream: Upstream,
    gatekeeper: Gatekeeper,
    limits: Limits,
    *,
    audiences: tuple[str, ...] = (),
    ttl: float = 2.0,
    on_review: Callable[[str], None] | None = None,
) -> TokenReviewer:
    """Who holds a driver's token: TokenReviews with the gatekeeper's own credentials, in
    their own upstream pool, within the review budget (docs/security.md)."""

    async def ask(token: str) -> ReviewOutcome:
        return await review_token(upstream, token, audiences)

    def driver_of(outcome: ReviewOutcome) -> str | None:
        return token_driver(outcome, gatekeeper.engine.policy, gatekeeper.node_name)

    return TokenReviewer(
        ask, budget=ReviewBudget(limits), driver_of=driver_of, ttl=ttl, on_review=on_review
    )


class Identifier:
    """Who every connection and request is (DESIGN §4.2), for the policy ``gatekeeper``
    serves now (reloads included).

    ``socket_drivers`` (each listening Unix socket's path → its driver) and ``token_ports``
    (the token listener's local ports) are filled as the listeners start; ``reviewer`` is None
    without a token listener. ``on_token_failure`` is told why each token request is no
    driver's (the metric), ``on_identified`` of each identified connection (the server notes a
    client certificate's expiry).
    """

    def __init__(
        self,
        gatekeeper: Gatekeeper,
        reviewer: TokenReviewer | None = None,
        *,
        on_token_failure: Callable[[TokenFailure], None] = lambda failure: None,
    ) -> None:
        self.gatekeeper = gatekeeper
        self.reviewer = reviewer
        self.socket_drivers: dict[str, str] = {}
        self.token_ports: set[int] = set()
        self.on_token_failure = on_token_failure
        self.on_identified: Callable[[Identity], None] | None = None

    def client_of(self, transport: Any) -> Client:
        """Who a new connection is, once, when it is made: its listener kind and the identity
        every request on it carries (the socket's directory, the verified certificate's CN), or
        the refusal each of them gets; a token listener's callers show themselves per request.
        """
        sockname = transport.get_extra_info("sockname")
        if isinstance(sockname, tuple) and sockname[1] in self.token_ports:
            return Client(ListenerKind.TOKEN)
        unix = isinstance(sockname, str) and sockname
        listener = ListenerKind.UNIX if unix else ListenerKind.MTLS
        try:
            identity = identify(transport, self.socket_drivers)
        except Refusal as refusal:
            return Client(listener, refusal=refusal)
        if self.on_identified is not None:
            self.on_identified(identity)
        return Client(listener, identity)

    async def identify(self, request: web.BaseRequest) -> Identity:
        """Who is calling: the identity its connection was given when it was made, or on the
        token listener the service account of the request's bearer token (reviewed, cached),
        whose connection is then counted as that driver's (docs/operating.md#limits)."""
        connection = request.protocol
        if not isinstance(connection, Connection) or connection.client is None:
            raise Refusal(401, "connection not identified", "Unauthorized: no identity")
        client = connection.client
        if client.listener is not ListenerKind.TOKEN:
            if client.identity is None:
                assert client.refusal is not None
                raise client.refusal
            return client.identity
        if self.reviewer is None:
            raise Refusal(401, "no token reviewer", "Unauthorized: no identity")
        try:
            identity = await self._token_identity(request, connection, self.reviewer)
        except TokenRefusal as refusal:
            self.on_token_failure(refusal.failure)
            # SECURITY: docs/security.md "The token listener" — refusals on one connection are
            # answered at a bounded rate, so that one keep-alive connection cannot make the
            # gatekeeper answer without bound.
            if (hold := self.reviewer.budget.pace(connection.reviews)) > 0:
                await asyncio.sleep(hold)
            raise
        except UpstreamError:
            self.on_token_failure(TokenFailure.REVIEW_UNAVAILABLE)
            raise
        if why := connection.attribute(identity.driver):
            raise Refusal(
                429, "too many connections", f"too many connections: {why}", retry_after=1
            )
        return identity

    async def _token_identity(
        self, request: web.BaseRequest, connection: Connection, reviewer: TokenReviewer
    ) -> Identity:
        # SECURITY: DESIGN §4.2, docs/security.md "The token listener" — a token not cached is
        # reviewed only within the caller's budget (its connection, its address, the process).
        outcome = await reviewer.review(shown_token(request.headers), connection.reviews)
        return token_identity(outcome, self.gatekeeper.engine.policy, self.gatekeeper.node_name)
