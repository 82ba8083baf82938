"""Kubernetes ``Status`` bodies, the only shape in which errors leave the gatekeeper."""

from __future__ import annotations

from typing import Any

from gatekeeper.types import KubeObject

__all__ = ["REASONS", "status_body"]

REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
"""The apiserver's ``StatusReason`` for each HTTP code it produces."""


def status_body(
    code: int,
    message: str,
    *,
    reason: str | None = None,
    details: dict[str, Any] | None = None,
) -> KubeObject:
    """A ``v1 Status`` failure object, laid out as the apiserver writes it."""
    body: KubeObject = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason if reason is not None else REASONS.get(code, ""),
    }
    if details or code == 405:
        # The apiserver's MethodNotAllowed carries empty details (recording 199).
        body["details"] = details or {}
    body["code"] = code
    return body
