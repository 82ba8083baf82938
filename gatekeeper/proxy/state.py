"""What the pipeline needs, built once by the server and shared by every request."""

from __future__ import annotations

from dataclasses import dataclass, field

from gatekeeper.audit import AuditLevel, AuditSink
from gatekeeper.policy import Engine
from gatekeeper.proxy.budgets import DriverBudgets
from gatekeeper.proxy.inflight import InFlight
from gatekeeper.proxy.listing import ListReads
from gatekeeper.proxy.sharedreads import SharedReads
from gatekeeper.upstream.session import Upstream

__all__ = ["Gatekeeper"]


@dataclass(slots=True)
class Gatekeeper:
    """What the pipeline needs, built once by the server and shared by every request."""

    engine: Engine
    upstream: Upstream
    audit: AuditSink
    audit_level: AuditLevel = AuditLevel.METADATA
    budgets: DriverBudgets = field(default_factory=DriverBudgets)
    """Per-driver in-flight and watch budgets (and the limits they come from)."""
    filtered_reads: ListReads = field(default_factory=SharedReads)
    """Filtered lists read once for every identical request waiting (docs/operating.md,
    "Filtered reads")."""

    @property
    def node_name(self) -> str:
        return self.engine.node_name

    @property
    def in_flight(self) -> InFlight:
        """The one count of requests in flight (drain, the gauge, the budgets)."""
        return self.budgets.in_flight
