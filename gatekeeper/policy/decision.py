"""The one verdict on a request, and the apiserver-style messages that explain a refusal."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.messages import capped
from gatekeeper.policy.model import Credentials
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.rule import Rule, Violation
from gatekeeper.types import KubeObject

__all__ = [
    "NOT_FOUND",
    "REJECTED_PREVIEW",
    "Decision",
    "allow",
    "answered",
    "deny",
    "forbid",
    "not_found",
    "rejected_preview",
]

_JSON = "application/json"
NOT_FOUND = "object not found"
"""The reason of a 404 for an object that does not exist (not a refusal: ``audit summarize``)."""
REJECTED_PREVIEW = "the apiserver rejected the patch preview"
"""The reason of a patch whose dry run the apiserver refused (its Status reaches the driver)."""


def rejected_preview(verb: str) -> str:
    """The reason of a write whose dry run the apiserver refused, naming what was previewed:
    ``create``, ``update`` (bodies only the apiserver decodes) or ``patch``
    (:data:`REJECTED_PREVIEW`)."""
    return f"the apiserver rejected the {verb} preview"


@dataclass(frozen=True, slots=True)
class Decision:
    """Allowed or not, and why: the only verdict (audit ``authorization.k8s.io/decision``).

    ``reason`` is the rule (audit annotation ``authorization.k8s.io/reason``); ``message`` the
    full Status message. ``code`` is 0 when the request is forwarded and the upstream answers;
    otherwise the gatekeeper answers with that code itself: a refusal (``allowed`` False), or
    an answer the apiserver already gave (``response``, e.g. a rejected patch preview).
    When forwarded, ``target``, ``body`` and ``media_type`` are exactly what is sent: they may
    carry injected selector terms, filled fields or a pinned resourceVersion (DESIGN §4.4).
    """

    allowed: bool
    reason: str
    code: int = 0
    message: str = ""
    target: RequestInfo | None = None
    body: Any = None
    media_type: str = _JSON
    """Content type of the forwarded ``body`` (a patch keeps its own)."""
    details: Mapping[str, Any] = field(default_factory=dict)
    filter: Callable[[KubeObject], bool] | None = None
    """For reads of a kind scoped object by object (DESIGN §4.3): the pure predicate an object
    of the response must pass to reach the driver. The proxy asks the upstream for plain JSON
    and applies it to the object, the list items or each watch event; None passes all."""
    retry_after: int | None = None
    """Seconds a refused client should wait (``Retry-After``, ``details.retryAfterSeconds``)."""
    response: KubeObject | None = None
    """The apiserver's own Status, answered as is (a patch preview it rejected)."""
    validation: str = ""
    """The policy's CEL validation that refused (its name, ``scope``, ``variables.<name>``);
    empty when none did."""
    credentials: Credentials = Credentials.GATEKEEPER
    """Whose credentials the forwarded request carries (rule DriverCredentials: the driver's)."""
    rule: Rule | None = None
    """The rule that refused (None when allowed): the audit's ``dra-gatekeeper.io/rule`` and
    the metrics' label, never read back from the message."""

    @property
    def forwards(self) -> bool:
        """Whether the request goes upstream (allowed, and no answer given already)."""
        return self.allowed and self.code == 0 and self.target is not None


def allow(
    reason: str,
    target: RequestInfo,
    body: Any = None,
    media_type: str = _JSON,
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


def deny(
    code: int, reason: str, message: str | None = None, *, rule: Rule | None = None, **details: str
) -> Decision:
    # Both reach the Status and the audit event: capped, whatever a body made them say.
    return Decision(
        allowed=False,
        reason=capped(reason),
        code=code,
        message=capped(message or reason),
        details=details,
        rule=rule if rule is not None else Rule.for_code(code),
    )


def answered(reason: str, code: int, status: KubeObject) -> Decision:
    """Allowed, and already answered by the apiserver with ``status`` (passed to the driver)."""
    return Decision(
        allowed=True,
        reason=reason,
        code=code,
        message=str(status.get("message", "")),
        response=status,
    )


def not_found(
    info: RequestInfo, qualified: str, reason: str = NOT_FOUND, rule: Rule = Rule.NOT_FOUND
) -> Decision:
    """404 with the apiserver's NotFound Status, laid out as it writes it (details: name, group,
    kind), so that an object hidden from the driver (``rule`` NOT_IN_SCOPE) reads exactly as an
    absent one."""
    details = {"name": info.name, "group": info.api_group, "kind": info.resource}
    message = f'{qualified} "{info.name}" not found'
    return deny(404, reason, message, rule=rule, **{k: v for k, v in details.items() if v})


def forbid(
    driver: str, info: RequestInfo, why: str | Violation, *, rule: Rule | None = None,
    name: str | None = None,
) -> Decision:  # fmt: skip
    """403 in the apiserver's RBAC phrasing, with the gatekeeper's rule appended: ``why`` is a
    :class:`~gatekeeper.rule.Violation` (its rule), or a message and its ``rule``."""
    if isinstance(why, Violation):
        rule, why = why.rule, why.message
    assert rule is not None, "a refusal names its rule"
    if not info.is_resource_request:
        message = f'forbidden: User "{driver}" cannot {info.verb} path "{info.path}": {why}'
        return deny(403, why, message, rule=rule)
    qualified = f"{info.resource}.{info.api_group}" if info.api_group else info.resource
    name = info.name if name is None else name
    subject = f'{qualified} "{name}"' if name else qualified
    resource = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
    scope = f'in the namespace "{info.namespace}"' if info.namespace else "at the cluster scope"
    message = (
        f'{subject} is forbidden: User "{driver}" cannot {info.verb} resource "{resource}" '
        f'in API group "{info.api_group}" {scope}: {why}'
    )
    # The apiserver leaves an empty group out of details (omitempty): {"kind": "secrets"}.
    details = {"group": info.api_group, "kind": info.resource, "name": name}
    return deny(403, why, message, rule=rule, **{k: v for k, v in details.items() if v})
