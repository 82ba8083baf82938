"""The TokenReview exchange (authentication.k8s.io/v1): who the apiserver says holds a bearer
token, asked with the gatekeeper's own credentials in the upstream pool of reviews.

What the answer means for a caller (which driver, this node or not), caching and budgets are
the listener's: :mod:`gatekeeper.listen.identity`. A review the apiserver cannot answer
(unreachable, 5xx, or a 403 because the gatekeeper lacks ``tokenreviews create``) is an
:class:`~gatekeeper.errors.UpstreamError` 503: fail closed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.errors import UpstreamError
from gatekeeper.upstream.session import Upstream, request

__all__ = ["TOKEN_REVIEWS", "ReviewOutcome", "review_token"]

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"


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


async def review_token(
    upstream: Upstream, token: str, audiences: tuple[str, ...] = ()
) -> ReviewOutcome:
    """POST a TokenReview of ``token`` (for ``audiences``; none: the apiserver's own) and read
    its answer; UpstreamError 503 when the apiserver gives none."""
    spec: dict[str, Any] = {"token": token}
    if audiences:
        spec["audiences"] = list(audiences)
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    try:
        code, answer = await request(upstream, "POST", TOKEN_REVIEWS, body, pool="reviews")
    except UpstreamError as exc:
        raise UpstreamError(503, f"cannot review the driver's token: {exc.message}") from None
    if code not in (200, 201):
        message = answer.get("message", "") if isinstance(answer, dict) else ""
        raise UpstreamError(
            503,
            f"cannot review the driver's token: the apiserver answered the TokenReview with "
            f"HTTP {code}: {message} (the gatekeeper needs create on tokenreviews)",
        )
    return ReviewOutcome.from_status(answer.get("status"))
