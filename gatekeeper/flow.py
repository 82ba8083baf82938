"""The one object carried through a request, from accept to audit."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gatekeeper.errors import Refusal
from gatekeeper.identity import Identity
from gatekeeper.policy.decision import Decision
from gatekeeper.requestinfo import RequestInfo
from gatekeeper.types import KubeObject

__all__ = ["Flow"]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class Flow:
    """Everything known about one request; the audit event is built from this alone."""

    method: str
    raw_target: str
    source_ips: tuple[str, ...]
    user_agent: str
    node_name: str
    audit_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    received: datetime = field(default_factory=_now)
    identity: Identity | None = None
    info: RequestInfo | None = None
    body: Any = None
    """The decoded request body (before the engine fills or pins anything)."""
    media_type: str = "application/json"
    current: KubeObject | None = None
    """The stored object fetched before deciding, if any."""
    proposed: KubeObject | None = None
    """The upstream's dry-run result of a strategic-merge or apply patch."""
    decision: Decision | None = None
    refusal: Refusal | None = None
    """Set when the gatekeeper answered the request itself (any 4xx it produced)."""
    status_code: int = 0
    status_message: str = ""
    response_object: KubeObject | None = None
    response_started: datetime | None = None
    completed: datetime | None = None
    upstream_audit_id: str = ""
    client_audit_id: str = ""
    """The driver's own ``Audit-ID``, sanitized: recorded as a hint, never used as the ID."""
    annotations: dict[str, str] = field(default_factory=dict)
    """Extra audit annotations set along the way (e.g. objects dropped as unevaluable)."""

    @property
    def long_running(self) -> bool:
        return self.info is not None and self.info.verb == "watch"

    def finish(self, code: int, message: str = "") -> None:
        self.status_code = code
        if message:
            self.status_message = message
        self.completed = _now()
