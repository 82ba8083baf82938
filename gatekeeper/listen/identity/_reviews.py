"""Who holds a bearer token: the apiserver's TokenReview answers
(:mod:`gatekeeper.upstream.tokenreview`), cached briefly and never by the token itself.

- A driver's token (an answer ``driver_of`` names a driver for) is reused for at most ``ttl``
  seconds counted from when the review was sent, never past the token's own ``exp``: the
  gatekeeper never accepts a token longer than ``ttl`` after the apiserver last did
  (docs/security.md, "How long a token works").
- Every other answer (rejected, or a service account that is no driver here) goes to a cache of
  its own for ``negative_ttl`` seconds, so that no number of them evicts a driver's entry.
  Both are bounded, least recently used first out.
- One review at a time per token: concurrent requests with the same token wait for the same
  answer. A review not yet asked takes its place in the :class:`ReviewBudget` first (429 past
  it); a cached answer is never counted there.
- Keys are SHA-256 digests of the token; the token is never stored, logged or forwarded.

A review the apiserver cannot answer is the exchange's
:class:`~gatekeeper.errors.UpstreamError` 503: fail closed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gatekeeper.errors import UpstreamError
from gatekeeper.listen.identity._budget import KNOWN_FOR, ReviewBudget, ReviewCaller
from gatekeeper.upstream.tokenreview import ReviewOutcome

__all__ = ["Ask", "DriverOf", "TokenReviewer"]

Ask = Callable[[str], Awaitable[ReviewOutcome]]
"""Asks the apiserver about a token (the TokenReview exchange)."""
DriverOf = Callable[[ReviewOutcome], "str | None"]
"""The driver an authenticated answer makes its holder on this node, if any (the policy's)."""


def _expiry(token: str) -> float | None:
    """The token's ``exp`` claim (seconds since the epoch), read without verifying anything:
    it can only make the cache keep an answer for less time than it otherwise would."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        exp = json.loads(payload).get("exp")
    except (ValueError, AttributeError):
        return None
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


@dataclass(slots=True)
class _Valid:
    """A driver's token: its answer is used until ``fresh_until``; until ``known_until`` (its
    ``exp``, or an hour after the last review) asking about it again takes the driver's share."""

    fresh_until: float
    known_until: float
    outcome: ReviewOutcome
    driver: str


class TokenReviewer:
    """Reviews tokens through ``ask``; see the module docstring for the cache rules."""

    def __init__(
        self,
        ask: Ask,
        *,
        budget: ReviewBudget | None = None,
        driver_of: DriverOf = lambda outcome: None,
        ttl: float = 2.0,
        negative_ttl: float = 2.0,
        max_valid: int = 1024,
        max_refused: int = 4096,
        on_review: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._ask_apiserver = ask
        self.budget = budget if budget is not None else ReviewBudget(clock=clock)
        self._driver_of = driver_of
        self.ttl, self.negative_ttl = ttl, negative_ttl
        self.max_valid, self.max_refused = max_valid, max_refused
        self._on_review = on_review or (lambda result: None)
        self._clock, self._wall = clock, wall_clock
        self._valid: OrderedDict[bytes, _Valid] = OrderedDict()
        self._refused: OrderedDict[bytes, tuple[float, ReviewOutcome]] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[tuple[ReviewOutcome, str | None]]] = {}

    def __len__(self) -> int:
        return len(self._valid) + len(self._refused)

    async def review(self, token: str, caller: ReviewCaller) -> ReviewOutcome:
        """The apiserver's answer about ``token`` (cached); UpstreamError 503 when it has none,
        a 429 :class:`~gatekeeper.listen.identity.TokenRefusal` when ``caller`` is over
        its review budget."""
        key = hashlib.sha256(token.encode()).digest()
        cached, known = self._cached(key, caller)
        if cached is not None:
            self._on_review("cached")
            return cached
        task = self._pending.get(key)
        if task is not None:
            self._on_review("cached")  # the answer another request is waiting for already
        else:
            self.budget.admit(caller, known)  # 429 past the caller's budget
            # Its own task: a requester that goes away does not cancel the others' answer.
            task = asyncio.ensure_future(self._ask_and_remember(key, token))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
        outcome, driver = await asyncio.shield(task)
        if driver is not None:
            self.budget.recognise(caller, driver)
        else:
            self.budget.distrust(caller)
        return outcome

    def _cached(self, key: bytes, caller: ReviewCaller) -> tuple[ReviewOutcome | None, str | None]:
        """The answer still cached for ``key`` (told to the budget), else None; and the driver
        whose token it was, when its answer expired but it is known still."""
        now = self._clock()
        known: str | None = None
        valid = self._valid.get(key)
        if valid is not None:
            if now < valid.fresh_until:
                self._valid.move_to_end(key)
                self.budget.recognise(caller, valid.driver)
                return valid.outcome, None
            if now < valid.known_until:
                known = valid.driver
            else:
                del self._valid[key]
        refused = self._refused.get(key)
        if refused is not None:
            if now < refused[0]:
                self._refused.move_to_end(key)
                self.budget.distrust(caller)
                return refused[1], None
            del self._refused[key]
        return None, known

    def _settled(self, key: bytes, task: asyncio.Future[tuple[ReviewOutcome, str | None]]) -> None:
        self._pending.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here: the waiters re-raise it, if any are left

    async def _ask_and_remember(self, key: bytes, token: str) -> tuple[ReviewOutcome, str | None]:
        # SECURITY: docs/security.md "How long a token works" — the answer's life is counted
        # from before the question: it says nothing of the token after the apiserver read it.
        asked = self._clock()
        outcome = await self._ask(token)
        driver = self._driver_of(outcome) if outcome.authenticated else None
        self._remember(key, token, outcome, driver, asked)
        return outcome, driver

    async def _ask(self, token: str) -> ReviewOutcome:
        try:
            outcome = await self._ask_apiserver(token)
        except UpstreamError:
            self._on_review("error")
            raise
        self._on_review("authenticated" if outcome.authenticated else "unauthenticated")
        return outcome

    def _remember(
        self, key: bytes, token: str, outcome: ReviewOutcome, driver: str | None, asked: float
    ) -> None:
        exp = _expiry(token) if outcome.authenticated else None
        left = math.inf if exp is None else exp - self._wall()
        if driver is None:
            self._valid.pop(key, None)  # no longer a driver's: its share is not for it
            ttl = min(self.ttl if outcome.authenticated else self.negative_ttl, left)
            if ttl > 0:
                _bounded_put(self._refused, key, (asked + ttl, outcome), self.max_refused)
            return
        if left <= 0:
            return
        entry = _Valid(asked + min(self.ttl, left), asked + min(KNOWN_FOR, left), outcome, driver)
        _bounded_put(self._valid, key, entry, self.max_valid)


def _bounded_put(cache: OrderedDict[bytes, Any], key: bytes, value: Any, most: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > most:
        cache.popitem(last=False)
