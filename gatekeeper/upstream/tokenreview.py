"""Who holds a bearer token: a TokenReview (authentication.k8s.io/v1) asked of the apiserver with
the gatekeeper's own credentials, cached briefly and never by the token itself.

- Positive answers are kept for at most ``ttl`` seconds (10 by default) and never past the
  token's own ``exp``: a deleted pod's token is accepted by the apiserver itself for a few
  seconds more (its token cache, recording 253), so a longer cache here would add to that.
- Negative answers are kept for ``negative_ttl`` seconds, so a client retrying a bad token does
  not turn each retry into a review.
- One review at a time per token: concurrent requests with the same token wait for the same
  answer. The cache is bounded (least recently used first out).
- Keys are SHA-256 digests of the token; the token is never stored, logged or forwarded.

A review the apiserver cannot answer (unreachable, 5xx, or a 403 because the gatekeeper lacks
``tokenreviews create``) is an :class:`~gatekeeper.errors.UpstreamError` 503: fail closed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.errors import UpstreamError
from gatekeeper.types import KubeObject

__all__ = ["TOKEN_REVIEWS", "Review", "ReviewOutcome", "TokenReviewer"]

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"

Review = Callable[[KubeObject], Awaitable[tuple[int, KubeObject]]]
"""POSTs a TokenReview and returns the apiserver's status code and answer."""


@dataclass(frozen=True, slots=True)
class ReviewOutcome:
    """The apiserver's answer about one token (``status`` of the TokenReview)."""

    authenticated: bool
    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    error: str = ""
    """Why the token was not authenticated, in the apiserver's words."""

    @classmethod
    def from_status(cls, status: Any) -> ReviewOutcome:
        if not isinstance(status, dict):
            return cls(False, error="the TokenReview answer has no status")
        user = status.get("user") if isinstance(status.get("user"), dict) else {}
        assert isinstance(user, dict)
        raw_extra = user.get("extra") if isinstance(user.get("extra"), dict) else {}
        assert isinstance(raw_extra, dict)
        extra = {
            str(k): tuple(str(v) for v in values)
            for k, values in raw_extra.items()
            if isinstance(values, list)
        }
        groups = user.get("groups") if isinstance(user.get("groups"), list) else []
        assert isinstance(groups, list)
        return cls(
            authenticated=status.get("authenticated") is True,
            username=str(user.get("username", "")),
            uid=str(user.get("uid", "")),
            groups=tuple(str(g) for g in groups),
            extra=extra,
            error=str(status.get("error", "")),
        )


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


class TokenReviewer:
    """Reviews tokens through ``review``; see the module docstring for the cache rules."""

    def __init__(
        self,
        review: Review,
        *,
        audiences: tuple[str, ...] = (),
        ttl: float = 10.0,
        negative_ttl: float = 2.0,
        max_entries: int = 4096,
        on_review: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._review = review
        self.audiences = audiences
        self.ttl, self.negative_ttl, self.max_entries = ttl, negative_ttl, max_entries
        self._on_review = on_review or (lambda result: None)
        self._clock, self._wall = clock, wall_clock
        self._cache: OrderedDict[bytes, tuple[float, ReviewOutcome]] = OrderedDict()
        self._pending: dict[bytes, asyncio.Future[ReviewOutcome]] = {}

    def __len__(self) -> int:
        return len(self._cache)

    async def review(self, token: str) -> ReviewOutcome:
        """The apiserver's answer about ``token`` (cached); UpstreamError 503 when it has none."""
        key = hashlib.sha256(token.encode()).digest()
        cached = self._cache.get(key)
        if cached is not None:
            expires, outcome = cached
            if self._clock() < expires:
                self._cache.move_to_end(key)
                self._on_review("cached")
                return outcome
            del self._cache[key]
        task = self._pending.get(key)
        if task is not None:
            self._on_review("cached")  # the answer another request is waiting for already
        else:
            # Its own task: a requester that goes away does not cancel the others' answer.
            task = asyncio.ensure_future(self._ask_and_remember(key, token))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._settled(key, done))
        return await asyncio.shield(task)

    def _settled(self, key: bytes, task: asyncio.Future[ReviewOutcome]) -> None:
        self._pending.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here: the waiters re-raise it, if any are left

    async def _ask_and_remember(self, key: bytes, token: str) -> ReviewOutcome:
        outcome = await self._ask(token)
        self._remember(key, token, outcome)
        return outcome

    async def _ask(self, token: str) -> ReviewOutcome:
        spec: dict[str, Any] = {"token": token}
        if self.audiences:
            spec["audiences"] = list(self.audiences)
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
        try:
            code, answer = await self._review(body)
        except UpstreamError as exc:
            self._on_review("error")
            raise UpstreamError(503, f"cannot review the driver's token: {exc.message}") from None
        if code not in (200, 201):
            self._on_review("error")
            message = answer.get("message", "") if isinstance(answer, dict) else ""
            raise UpstreamError(
                503,
                f"cannot review the driver's token: the apiserver answered the TokenReview with "
                f"HTTP {code}: {message} (the gatekeeper needs create on tokenreviews)",
            )
        outcome = ReviewOutcome.from_status(answer.get("status"))
        self._on_review("authenticated" if outcome.authenticated else "unauthenticated")
        return outcome

    def _remember(self, key: bytes, token: str, outcome: ReviewOutcome) -> None:
        ttl = self.ttl if outcome.authenticated else self.negative_ttl
        if outcome.authenticated and (exp := _expiry(token)) is not None:
            ttl = min(ttl, exp - self._wall())
        if ttl <= 0:
            return
        self._cache[key] = (self._clock() + ttl, outcome)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
