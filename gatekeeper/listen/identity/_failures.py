"""Why a request on the token listener is no driver's: a fixed set of reasons, carried by the
refusal that answers it, so that metrics count them by value, never by message text."""

from __future__ import annotations

from enum import Enum

from gatekeeper.errors import Refusal
from gatekeeper.rule import Rule

__all__ = ["TokenFailure", "TokenRefusal"]


class TokenFailure(Enum):
    """Why a request on the token listener is no driver's (a fixed set: a metric label)."""

    NO_BEARER = "no-bearer"
    """No ``Authorization: Bearer`` token: 401."""
    RATE_LIMITED = "rate-limited"
    """Its token was not cached and the caller is over its review budget: 429."""
    REVIEW_UNAVAILABLE = "review-unavailable"
    """The TokenReview failed upstream (unreachable, 5xx, no RBAC): 503."""
    REJECTED = "rejected"
    """The TokenReview did not authenticate the token (invalid, expired, revoked): 401."""
    UNMAPPED = "unmapped-service-account"
    """Authenticated, but not a service account the policy maps to a driver: 403."""
    UNBOUND = "unbound"
    """A mapped service account's token bound to no node (policy ``unboundTokens``): 403."""
    WRONG_NODE = "wrong-node"
    """A mapped service account's token bound to a pod on another node: 403."""


class TokenRefusal(Refusal):
    """A :class:`~gatekeeper.errors.Refusal` of a token listener request, with its
    :class:`TokenFailure` (rendered as any refusal; the value is for metrics)."""

    def __init__(
        self,
        failure: TokenFailure,
        code: int,
        reason: str,
        message: str,
        *,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(code, reason, message, rule=_RULES[failure], retry_after=retry_after)
        self.failure = failure


# The rule each failure breaks (the refusals metric's label, beside this one's own).
_RULES = {
    TokenFailure.NO_BEARER: Rule.UNAUTHENTICATED,
    TokenFailure.RATE_LIMITED: Rule.RATE_LIMITED,
    TokenFailure.REVIEW_UNAVAILABLE: Rule.UPSTREAM_FAILED,
    TokenFailure.REJECTED: Rule.UNAUTHENTICATED,
    TokenFailure.UNMAPPED: Rule.DRIVER_NOT_ALLOWED,
    TokenFailure.UNBOUND: Rule.NODE_MISMATCH,
    TokenFailure.WRONG_NODE: Rule.NODE_MISMATCH,
}
