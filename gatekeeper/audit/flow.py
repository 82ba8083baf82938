"""The objects carried through the gatekeeper: a :class:`Client` per connection, known when it
is made, and a :class:`Flow` per request, from accept to audit (mitmproxy's ``client_conn`` and
``HTTPFlow``)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gatekeeper.errors import Refusal
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.policy.decision import Decision
from gatekeeper.policy.plan import Preview
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import Identity, KubeObject

__all__ = ["Client", "Flow", "Forwarded"]


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Client:
    """One connection, as known when it was made: computed once, read by every request on it.

    On a Unix socket the driver is the socket's directory, on the mTLS listener the CN of the
    certificate its handshake verified (DESIGN §4.2): either is the ``identity``, or the
    ``refusal`` (401) that every request on the connection gets. On the token listener each
    request shows its own token, so neither is set. Each request's identity is then checked
    against the policy being served (a reload may have removed the driver).
    """

    listener: ListenerKind
    """The listener the connection was made to (a driver's: never the health listener)."""
    identity: Identity | None = None
    refusal: Refusal | None = None


@dataclass(frozen=True, slots=True)
class Forwarded:
    """What the gatekeeper sent upstream for a request (audit ``dra-gatekeeper.io/forwarded``)."""

    method: str
    target: str
    """Path and canonical query, as sent."""
    media_type: str | None = None
    """Content type of the forwarded body; None when there is no body."""

    def __str__(self) -> str:
        return f"{self.method} {self.target}"


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
    proposed: Preview | None = None
    """The dry run of a strategic-merge or apply patch, with the upstream's answer."""
    decision: Decision | None = None
    """The one verdict: the engine's, or a refusal made before it (headers, path, body)."""
    forwarded: Forwarded | None = None
    """What was sent upstream, when the request was forwarded."""
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
