"""Errors of the embedded API server, each rendered as the apiserver's ``Status`` body."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gatekeeper.apiserver._kinds import ServedKind, qualified_kind, qualified_resource
from gatekeeper.apiserver._status import status_body
from gatekeeper.apiserver._types import KubeObject

__all__ = [
    "PROTOBUF",
    "APIError",
    "already_exists",
    "bad_request",
    "conflict",
    "field_invalid",
    "generic_invalid",
    "gone",
    "invalid",
    "not_found",
    "path_not_found",
    "render_value",
    "unknown_body_format",
    "unsupported_media_type",
]


class APIError(Exception):
    """A refusal: HTTP ``code`` with the Status ``body`` and extra response ``headers``."""

    def __init__(self, body: KubeObject, headers: dict[str, str] | None = None) -> None:
        super().__init__(body.get("message", ""))
        self.body = body
        self.code = int(body["code"])
        self.headers = headers or {}


def _with_details(code: int, message: str, details: dict[str, Any] | None, **kw: Any) -> APIError:
    body = status_body(code, message, details=details, **kw)
    if details is not None and not details:  # the apiserver writes an empty "details": {}
        body = {k: v for k, v in body.items() if k != "code"} | {"details": {}, "code": code}
    return APIError(body)


def bad_request(message: str) -> APIError:
    """400 BadRequest without details."""
    return APIError(status_body(400, message))


def path_not_found() -> APIError:
    """404 for a path nothing is served at, as the apiserver's not-found handler."""
    return _with_details(404, "the server could not find the requested resource", {})


def _resource_details(kind: ServedKind, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name} if name else {}
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind.resource
    return details


def not_found(kind: ServedKind, name: str) -> APIError:
    """404: ``resourceslices.resource.k8s.io "x" not found``."""
    message = f'{qualified_resource(kind)} "{name}" not found'
    return APIError(status_body(404, message, details=_resource_details(kind, name)))


def already_exists(kind: ServedKind, name: str) -> APIError:
    """409 AlreadyExists on create."""
    message = f'{qualified_resource(kind)} "{name}" already exists'
    return APIError(
        status_body(409, message, reason="AlreadyExists", details=_resource_details(kind, name))
    )


def conflict(kind: ServedKind, name: str, why: str, *, by_kind: bool = False) -> APIError:
    """409 Conflict: ``Operation cannot be fulfilled on <resource or kind> "x": <why>``.

    Updates name the resource (``resourceslices.resource.k8s.io``); delete preconditions
    name the kind (``ResourceSlice.resource.k8s.io``), as the apiserver does.
    """
    target = qualified_kind(kind) if by_kind else qualified_resource(kind)
    details = _resource_details(kind, name)
    if by_kind:
        details["kind"] = kind.kind
    message = f'Operation cannot be fulfilled on {target} "{name}": {why}'
    return APIError(status_body(409, message, details=details))


def field_invalid(path: str, value: Any, detail: str) -> dict[str, str]:
    """One ``FieldValueInvalid`` cause for :func:`invalid`."""
    return {
        "reason": "FieldValueInvalid",
        "message": f"Invalid value: {render_value(value)}: {detail}",
        "field": path,
    }


def invalid(kind: ServedKind, name: str, causes: Sequence[dict[str, str]]) -> APIError:
    """422 Invalid: ``Kind.group "x" is invalid: field: message`` (``[...]`` for several)."""
    parts = [f"{cause['field']}: {cause['message']}" for cause in causes]
    summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    message = f'{qualified_kind(kind)} "{name}" is invalid: {summary}'
    details: dict[str, Any] = {"name": name}
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind.kind
    details["causes"] = list(causes)
    return APIError(status_body(422, message, details=details))


def gone(message: str, continue_token: str | None = None) -> APIError:
    """410 Expired (too old resourceVersion or continue token)."""
    body = status_body(410, message, reason="Expired")
    if continue_token:
        body["metadata"] = {"continue": continue_token}
    return APIError(body)


def unsupported_media_type(message: str = "415: Unsupported Media Type") -> APIError:
    """415 with the apiserver's generic message and empty details (recording 58)."""
    return _with_details(415, message, {})


PROTOBUF = "application/vnd.kubernetes.protobuf"


def unknown_body_format(kind: ServedKind, media_type: str) -> APIError:
    """415 for a body the embedded server does not read, in the apiserver's words (recording 226,
    no details). The list is what a real apiserver accepts for the kind (protobuf too for a
    built-in kind, never for a custom resource), except that a protobuf body is answered as a
    server without a protobuf decoder answers: the embedded server does not decode protobuf,
    so it must not claim to, and a client that reads the list falls back to JSON."""
    accepted = ["application/json", "application/yaml"]
    if not kind.custom and media_type != PROTOBUF:
        accepted.append(PROTOBUF)
    message = "the body of the request was in an unknown format - accepted media types include: "
    return APIError(status_body(415, message + ", ".join(accepted)))


def generic_invalid() -> APIError:
    """422 as the apiserver answers a JSON patch that cannot be applied (recording 51)."""
    return _with_details(422, "the server rejected our request due to an error in our request", {})


def render_value(value: Any) -> str:
    """A value as the apiserver quotes it in field errors (strings in double quotes)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
