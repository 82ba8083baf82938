"""Connection capacity: who holds how many open connections, per listener kind
(docs/operating.md#limits).

Drivers' connections are capped per driver and in total, separately for each listener kind
(Unix sockets, mTLS, …), so that no listener takes another's capacity. Connections that are
no driver's (yet) — a TLS handshake in progress, a certificate naming no driver — are held in a
small bucket per listener kind that never takes a driver's capacity; when it is full its
oldest connection is closed. Every count is keyed by a driver (a socket directory, or the CN
of a certificate the handshake verified and the policy allows) or by
:data:`UNAUTHENTICATED`: never by a value the client chose, so state and metric series stay
bounded.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable

from gatekeeper.audit import build_event
from gatekeeper.audit.flow import Client, Flow
from gatekeeper.limits import DEFAULT_LIMITS, Limits
from gatekeeper.listenerkind import ListenerKind
from gatekeeper.proxy.state import Gatekeeper

__all__ = ["CALLER_ANNOTATION", "UNAUTHENTICATED", "ConnectionGuard", "Ticket"]

log = logging.getLogger("gatekeeper.connections")

CALLER_ANNOTATION = "dra-gatekeeper.io/connection-caller"
"""Audit annotation of answers given before a request was read: the driver (socket directory
or certificate CN) whose connection it was, or ``unauthenticated``."""
UNAUTHENTICATED = "unauthenticated"
"""The caller of a connection that is not (yet) a driver's, in counts and metrics."""


class Ticket:
    """One counted connection: its listener kind, whose it is (a driver, or
    :data:`UNAUTHENTICATED`), and how to close it (for the unauthenticated bucket's oldest)."""

    __slots__ = ("caller", "close", "counted", "listener")

    def __init__(self, listener: ListenerKind, caller: str, close: Callable[[], None]) -> None:
        self.listener = listener
        self.caller = caller
        self.close = close
        self.counted = True


class ConnectionGuard:
    """Counts open connections per listener kind and caller; shared by every listener.

    The hook for listeners whose connections are known only after a request (a bearer-token
    listener): count each at accept with :meth:`admit_unauthenticated` under the listener's
    own kind, and once a request has shown whose it is, :meth:`attribute` moves it to that
    driver's count (or refuses it, over the driver's caps). The mTLS listener does the same
    with the certificate its handshake verified.
    """

    def __init__(self, gatekeeper: Gatekeeper, limits: Limits = DEFAULT_LIMITS) -> None:
        self.gatekeeper = gatekeeper
        self.limits = limits
        self.open: Counter[tuple[ListenerKind, str]] = Counter()
        """Open connections per (listener kind, caller)."""
        self.totals: Counter[ListenerKind] = Counter()
        """Open drivers' connections per listener kind."""
        self.refused = Counter[tuple[ListenerKind, str]]()
        """Connections closed as over a cap, per (listener kind, caller)."""
        self.malformed = 0
        """Requests aiohttp refused before the handler (answered with a Status)."""
        self.header_timeouts = 0
        """Connections closed because a request's headers did not complete in time."""
        self._unauthenticated: dict[ListenerKind, OrderedDict[Ticket, None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def driver_of(self, client: Client) -> str | None:
        """The driver a connection is counted as: its identity's, when the policy allows that
        driver; None (the unauthenticated bucket) for a socket no driver is bound to, no client
        certificate, or a certificate whose CN is not a driver on this node."""
        identity = client.identity
        if identity is None or not self.gatekeeper.engine.policy.allows_driver(identity.driver):
            return None
        return identity.driver

    def admit(self, listener: ListenerKind, driver: str, close: Callable[[], None]) -> Ticket | str:
        """Count a new connection of ``driver``; its Ticket, or the reason to refuse it."""
        if why := self._full(listener, driver):
            self._refused(listener, driver, why)
            return why
        ticket = Ticket(listener, driver, close)
        self.open[(listener, driver)] += 1
        self.totals[listener] += 1
        return ticket

    def admit_unauthenticated(self, listener: ListenerKind, close: Callable[[], None]) -> Ticket:
        """Count a connection that is no driver's (yet) in ``listener``'s bucket; when the
        bucket is full its oldest connection is closed to make room, so that connections
        that never authenticate cannot keep a driver's handshake out."""
        waiting = self._unauthenticated.setdefault(listener, OrderedDict())
        while len(waiting) >= self.limits.connections_unauthenticated:
            oldest, _ = waiting.popitem(last=False)
            self._uncount(oldest)
            self._refused(listener, UNAUTHENTICATED, "the oldest unauthenticated connection")
            oldest.close()
        ticket = Ticket(listener, UNAUTHENTICATED, close)
        waiting[ticket] = None
        self.open[(listener, UNAUTHENTICATED)] += 1
        return ticket

    def attribute(self, ticket: Ticket, driver: str) -> str | None:
        """Move an unauthenticated connection to ``driver``'s count: None, or the reason it is
        refused (over the driver's caps; the ticket is then released)."""
        if not ticket.counted:
            return "the connection was closed"
        self.release(ticket)
        admitted = self.admit(ticket.listener, driver, ticket.close)
        if isinstance(admitted, str):
            return admitted
        ticket.caller, ticket.counted = driver, True
        return None

    def release(self, ticket: Ticket) -> None:
        """The connection closed (idempotent)."""
        if ticket.counted:
            self._uncount(ticket)

    def _uncount(self, ticket: Ticket) -> None:
        ticket.counted = False
        key = (ticket.listener, ticket.caller)
        self.open[key] -= 1
        if self.open[key] <= 0:
            del self.open[key]
        if ticket.caller == UNAUTHENTICATED:
            self._unauthenticated.get(ticket.listener, {}).pop(ticket, None)  # type: ignore[call-overload]
        else:
            self.totals[ticket.listener] -= 1

    def _full(self, listener: ListenerKind, driver: str) -> str:
        total = self.totals[listener]
        if total >= self.limits.connections_total:
            where = f"on its {listener} listeners"
            return f"the gatekeeper has {total} open connections {where}, its limit"
        held = self.open[(listener, driver)]
        if held >= self.limits.connections_per_driver:
            return f'"{driver}" has {held} open connections, the most one driver may'
        return ""

    def _refused(self, listener: ListenerKind, caller: str, why: str) -> None:
        count = self.refused[(listener, caller)] = self.refused[(listener, caller)] + 1
        if count == 1 or count % 100 == 0:
            log.warning("connection refused listener=%s caller=%s refused=%d reason=%s",
                        listener, caller, count, why)  # fmt: skip

    def flow(self, method: str, caller: str) -> Flow:
        """A Flow for an answer given before a request could be read (no identity yet: the
        caller, as counted for connection caps, goes in an annotation)."""
        flow = Flow(
            method=method,
            raw_target="",
            source_ips=(),
            user_agent="",
            node_name=self.gatekeeper.node_name,
        )
        if caller:
            flow.annotations[CALLER_ANNOTATION] = caller
        return flow

    def audit(self, flow: Flow) -> None:
        """Emit ``flow``'s event from a synchronous protocol callback."""
        event = build_event(flow, self.gatekeeper.audit_level)
        task = asyncio.get_running_loop().create_task(self.gatekeeper.audit.emit(event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
