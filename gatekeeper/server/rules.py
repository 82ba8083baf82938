"""The rule that refused a request, from a fixed set: the value of metric labels.

A refusal's reason names pool names, selectors and paths the driver chose; a metric label
taken from it would let a client mint new series at will. Metrics say which rule refused
(``pool-prefix``, ``kind-not-allowed``, …); the audit event keeps the whole reason.
"""

from __future__ import annotations

import re

__all__ = ["RULES", "rule_of"]

# Ordered: the first pattern found in a 403 reason names its rule.
_FORBIDDEN: tuple[tuple[str, str], ...] = (
    ("does not allow this resource", "kind-not-allowed"),
    ("is not allowed on node", "driver-not-allowed"),
    ("does not match the calling driver", "driver-mismatch"),
    ("does not match this node", "node-mismatch"),
    ("is not prefixed by node name", "pool-prefix"),
    ("requires fieldSelector", "selector-required"),
    ("differs from the stored object", "status-entries"),
    ("the stored object", "not-owner"),
    ("status subresource", "status-subresource-only"),
    ("own Node", "own-node-only"),
    ("only discovery", "discovery-not-allowed"),
    ("header ", "header-not-allowed"),
    ("upgrade", "upgrade-not-allowed"),
    ("method ", "method-not-allowed"),
    (" is set", "forbidden-field"),
    ("verb ", "verb-not-allowed"),
)
_BAD_REQUEST: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"no continue token"), "continue-refused"),
    (re.compile(r"body|JSON|YAML|DeleteOptions|nested|finite|metadata"), "bad-body"),
    (re.compile(r"query|fieldSelector|labelSelector|watch"), "bad-query"),
    (re.compile(r"malformed HTTP"), "malformed-http"),
)
_BY_CODE = {
    401: "unauthenticated",
    404: "not-in-scope",
    405: "method-not-allowed",
    408: "body-timeout",
    409: "conflict",
    413: "body-too-large",
    415: "unsupported-media-type",
    429: "rate-limited",
    500: "internal-error",
}

RULES = frozenset(
    {rule for _, rule in _FORBIDDEN}
    | {rule for _, rule in _BAD_REQUEST}
    | set(_BY_CODE.values())
    | {"bad-path", "audit-unwritable", "upstream-failed", "other"}
)
"""Every value :func:`rule_of` returns."""


def rule_of(code: int, reason: str) -> str:
    """The rule behind a refusal with HTTP ``code`` and audit ``reason``; ``other`` if none
    matches (never text of the reason itself)."""
    if code == 403:
        return next((rule for text, rule in _FORBIDDEN if text in reason), "other")
    if code == 400:
        for pattern, rule in _BAD_REQUEST:
            if pattern.search(reason):
                return rule
        return "bad-path"  # the rest of the 400s are about the request target
    if code == 503:
        return "audit-unwritable" if "audit" in reason else "upstream-failed"
    if code in (502, 504):
        return "upstream-failed"
    return _BY_CODE.get(code, "other")
