"""The kinds of listener the gatekeeper runs: a leaf value, known where a connection is made and
read as this type by every layer after it (connection caps, the descriptor budget, metrics,
audit)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ListenerKind"]


class ListenerKind(StrEnum):
    """A kind of listener. Each has caps of its own, so that no listener takes another's
    capacity (docs/operating.md, "Limits"); the value is the ``listener`` label of the metrics
    and the audit event's ``dra-gatekeeper.io/transport``.
    """

    UNIX = "unix"
    """A driver's Unix socket (``--socket-dir``): the driver is the socket's directory."""
    MTLS = "mtls"
    """Mutual TLS (``--listen``): the driver is the client certificate's CN."""
    TOKEN = "token"
    """TLS with the driver's ServiceAccount token (``--listen-token``), reviewed per request."""
    HEALTH = "health"
    """``/healthz``, ``/readyz``, ``/metrics`` (``--health-listen``): no driver's."""

    @property
    def serves_drivers(self) -> bool:
        """Whether drivers' requests arrive here (every kind but the health listener)."""
        return self is not ListenerKind.HEALTH

    @classmethod
    def of_label(cls, label: str | None, default: ListenerKind) -> ListenerKind:
        """The kind a label names (as read back from an audit log), else ``default``."""
        try:
            return cls(label) if label else default
        except ValueError:
            return default
