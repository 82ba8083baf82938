"""The engine's answer, and the apiserver-style messages that explain a refusal."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.requestinfo import RequestInfo
from gatekeeper.types import KubeObject

__all__ = ["Decision", "allow", "deny", "forbid"]


@dataclass(frozen=True, slots=True)
class Decision:
    """Allowed or not, and why.

    ``reason`` is the rule (audit annotation ``authorization.k8s.io/reason``); ``message`` the
    full Status message. When allowed, ``target`` and ``body`` are what to forward: they may
    carry injected selector terms, filled fields or a pinned resourceVersion (DESIGN §4.4).
    """

    allowed: bool
    reason: str
    code: int = 0
    message: str = ""
    target: RequestInfo | None = None
    body: Any = None
    media_type: str = "application/json"
    """Content type of the forwarded ``body`` (a patch keeps its own)."""
    details: Mapping[str, str] = field(default_factory=dict)
    filter: Callable[[KubeObject], bool] | None = None
    """For reads of a kind scoped object by object (DESIGN §4.3): the pure predicate an object
    of the response must pass to reach the driver. The proxy asks the upstream for plain JSON
    and applies it to the object, the list items or each watch event; None passes all."""


def allow(
    reason: str,
    target: RequestInfo,
    body: Any = None,
    media_type: str = "application/json",
    *,
    filter: Callable[[KubeObject], bool] | None = None,
) -> Decision:
    return Decision(
        allowed=True,
        reason=reason,
        target=target,
        body=body,
        media_type=media_type,
        filter=filter,
    )


def deny(code: int, reason: str, message: str | None = None, **details: str) -> Decision:
    return Decision(
        allowed=False, reason=reason, code=code, message=message or reason, details=details
    )


def forbid(driver: str, info: RequestInfo, why: str, *, name: str | None = None) -> Decision:
    """403 in the apiserver's RBAC phrasing, with the gatekeeper's rule appended."""
    if not info.is_resource_request:
        message = f'forbidden: User "{driver}" cannot {info.verb} path "{info.path}": {why}'
        return deny(403, why, message)
    qualified = f"{info.resource}.{info.api_group}" if info.api_group else info.resource
    name = info.name if name is None else name
    subject = f'{qualified} "{name}"' if name else qualified
    resource = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
    scope = f'in the namespace "{info.namespace}"' if info.namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{driver}" cannot {info.verb} resource "{resource}" '
        f'in API group "{info.api_group}" {scope}: {why}'
    )
    details = {"group": info.api_group, "kind": info.resource}
    if name:
        details["name"] = name
    return deny(403, why, message, **details)
