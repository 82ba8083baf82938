"""Which rule refused a request: a fixed set, carried as a type from where the refusal is made to
the audit event (``dra-gatekeeper.io/rule``) and the metrics (the ``reason`` label).

A refusal's message names pool names, selectors and paths the driver chose; a label taken from
it would let a client mint new series, and matching our own wording would let a reworded
message silently move a count. So the rule is decided where the refusal is made, never read
back from its text.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Rule", "Violation"]


class Rule(enum.StrEnum):
    """One rule a request can break (the metric label ``reason``)."""

    # Who is calling, and what it names.
    UNAUTHENTICATED = "unauthenticated"
    DRIVER_NOT_ALLOWED = "driver-not-allowed"
    KIND_NOT_ALLOWED = "kind-not-allowed"
    VERSION_NOT_ALLOWED = "version-not-allowed"
    VERB_NOT_ALLOWED = "verb-not-allowed"
    SUBRESOURCE_NOT_ALLOWED = "subresource-not-allowed"
    DISCOVERY_NOT_ALLOWED = "discovery-not-allowed"
    # The request's form (DESIGN §4.5).
    METHOD_NOT_ALLOWED = "method-not-allowed"
    HEADER_NOT_ALLOWED = "header-not-allowed"
    UPGRADE_NOT_ALLOWED = "upgrade-not-allowed"
    BAD_PATH = "bad-path"
    BAD_QUERY = "bad-query"
    BAD_BODY = "bad-body"
    MALFORMED_HTTP = "malformed-http"
    CONTINUE_REFUSED = "continue-refused"
    BODY_TOO_LARGE = "body-too-large"
    BODY_TIMEOUT = "body-timeout"
    UNSUPPORTED_MEDIA_TYPE = "unsupported-media-type"
    # Whose the object is (DESIGN §4.3).
    DRIVER_MISMATCH = "driver-mismatch"
    NODE_MISMATCH = "node-mismatch"
    POOL_PREFIX = "pool-prefix"
    FORBIDDEN_FIELD = "forbidden-field"
    NOT_OWNER = "not-owner"
    SELECTOR_REQUIRED = "selector-required"
    STATUS_ENTRIES = "status-entries"
    STATUS_SUBRESOURCE_ONLY = "status-subresource-only"
    OWN_OBJECT_ONLY = "own-object-only"
    MAY_CHANGE = "may-change"
    NAMESPACE_NOT_ALLOWED = "namespace-not-allowed"
    NO_DRIVER_CREDENTIALS = "no-driver-credentials"
    CEL_VALIDATION = "cel-validation"
    NOT_IN_SCOPE = "not-in-scope"
    # The object's state, as the apiserver would answer.
    NOT_FOUND = "not-found"
    CONFLICT = "conflict"
    INVALID = "invalid"
    # Limits and faults.
    RATE_LIMITED = "rate-limited"
    AUDIT_UNWRITABLE = "audit-unwritable"
    UPSTREAM_FAILED = "upstream-failed"
    INTERNAL_ERROR = "internal-error"
    OTHER = "other"

    @classmethod
    def for_code(cls, code: int) -> Rule:
        """The rule of a refusal that names none: the one its HTTP code stands for."""
        return _BY_CODE.get(code, cls.UPSTREAM_FAILED if code in (502, 503, 504) else cls.OTHER)

    @classmethod
    def of_label(cls, label: str) -> Rule:
        """The rule an audit event's ``dra-gatekeeper.io/rule`` names (OTHER when none)."""
        try:
            return cls(label)
        except ValueError:
            return cls.OTHER


_BY_CODE = {
    400: Rule.BAD_PATH,
    401: Rule.UNAUTHENTICATED,
    404: Rule.NOT_FOUND,
    405: Rule.METHOD_NOT_ALLOWED,
    408: Rule.BODY_TIMEOUT,
    409: Rule.CONFLICT,
    413: Rule.BODY_TOO_LARGE,
    415: Rule.UNSUPPORTED_MEDIA_TYPE,
    422: Rule.INVALID,
    429: Rule.RATE_LIMITED,
    500: Rule.INTERNAL_ERROR,
}


@dataclass(frozen=True, slots=True)
class Violation:
    """Why an object is not the caller's to touch: the rule and the message (a Status's)."""

    rule: Rule
    message: str

    def prefixed(self, prefix: str) -> Violation:
        return Violation(self.rule, prefix + self.message)
