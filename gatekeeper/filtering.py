"""Responses of kinds scoped object by object (ResourceClaims): filtered before the driver sees
them (DESIGN §4.3). The engine's Decision carries the pure predicate; this module applies it.

- get: the object, or 404 when it is out of scope (existence is not revealed);
- list: the items in scope (the list is parsed in memory, up to :data:`MAX_FILTERED_BODY`;
  ``remainingItemCount`` is dropped, as it counts hidden objects);
- watch: event by event, line by line (at most :data:`MAX_WATCH_LINE` bytes per event). An
  object that leaves scope is sent once as ``DELETED`` (metadata only), one that enters it as
  ``ADDED``; ``BOOKMARK`` and ``ERROR`` pass.

The upstream is always asked for plain JSON: a ``Table`` or ``PartialObjectMetadata`` lacks
what the scope needs, so it is never passed on unfiltered.

An object the gatekeeper cannot evaluate (nested deeper than
:data:`~gatekeeper.jsonbounds.MAX_OBJECT_DEPTH`, or a shape the scope cannot read) is dropped:
fail closed for that object alone, counted in :data:`DROPPED`, logged, and listed on the
request's audit event; the rest of the list or watch goes on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from gatekeeper.errors import UpstreamError
from gatekeeper.jsonbounds import MAX_OBJECT_DEPTH, parse_bounded, within_depth
from gatekeeper.policy.claims import OUT_OF_SCOPE
from gatekeeper.policy.decision import Decision, not_found
from gatekeeper.requestinfo import RequestInfo
from gatekeeper.status import status_body
from gatekeeper.types import KubeObject
from gatekeeper.upstream import Upstream, read_json_object

__all__ = [
    "DROPPED",
    "DROPPED_ANNOTATION",
    "MAX_FILTERED_BODY",
    "MAX_WATCH_LINE",
    "PLAIN_JSON",
    "WatchFilter",
    "prime_watch",
    "scoped_chunks",
]

PLAIN_JSON = "application/json"
MAX_FILTERED_BODY = 64 * 1024 * 1024
"""A filtered get or list is parsed in memory up to this size (else 502: page with limit=)."""
MAX_WATCH_LINE = 8 * 1024 * 1024
"""One watch event (one line) at most; an object is at most ~1.5 MiB in etcd."""

DROPPED_ANNOTATION = "dra-gatekeeper.io/dropped-unevaluable"
"""Audit annotation: objects left out of this answer because they could not be evaluated."""

log = logging.getLogger("gatekeeper.filtering")


class _Counter:
    """A process-wide count (exported by the metrics endpoint)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


DROPPED = _Counter()
"""Objects dropped from filtered answers because the gatekeeper could not evaluate them."""

_Keep = Callable[[KubeObject], bool]
_Key = tuple[str, str]
_PASSED = frozenset({"BOOKMARK", "ERROR"})
_TRUE = frozenset({"1", "t", "T", "true", "True", "TRUE"})


class WatchFilter:
    """Per-watch state: which objects the driver has been shown as in scope."""

    def __init__(self, keep: _Keep, shown: set[_Key] | None = None) -> None:
        self.keep = keep
        self.shown: set[_Key] = shown or set()
        """(namespace, name) of every object the client holds as in scope."""
        self.dropped: list[str] = []
        """``namespace/name`` of the objects dropped as unevaluable (for the audit event)."""

    def inside(self, obj: Any) -> bool:
        """Whether ``obj`` is in scope; an object that cannot be evaluated is not (counted)."""
        try:
            kept = self.keep(obj)
        except (RecursionError, TypeError, ValueError, AttributeError, KeyError):
            kept = True  # a shape the scope cannot read: not shown, and reported as such
            evaluable = False
        else:
            evaluable = not kept or within_depth(obj, MAX_OBJECT_DEPTH)
        if evaluable:
            return kept
        namespace, name = _key(obj) if isinstance(obj, dict) else ("", "")
        self.dropped.append(f"{namespace}/{name}" if namespace else name)
        DROPPED.value += 1
        log.warning(
            "dropped an object the gatekeeper cannot evaluate namespace=%s name=%s "
            "reason=nested deeper than %d levels or unreadable",
            namespace,
            name,
            MAX_OBJECT_DEPTH,
        )
        return False

    def annotation(self) -> str:
        """The audit annotation value: how many objects were dropped, and the first few."""
        shown = ", ".join(self.dropped[:5]) + (", ..." if len(self.dropped) > 5 else "")
        return f"{len(self.dropped)}: {shown}"

    def event(self, event: Any) -> Any | None:
        """The event to send for upstream ``event`` (maybe retyped), or None to drop it."""
        if not isinstance(event, dict):
            return None
        kind, obj = event.get("type"), event.get("object")
        if kind in _PASSED:
            return event
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not isinstance(obj, dict):
            return None  # fail closed on anything this filter does not understand
        key = _key(obj)
        inside = self.inside(obj)
        was_shown = key in self.shown
        if kind == "DELETED":
            self.shown.discard(key)
            if inside:
                return event
            return {"type": "DELETED", "object": _stub(obj)} if was_shown else None
        if inside:
            self.shown.add(key)
            return event if was_shown or kind == "ADDED" else {"type": "ADDED", "object": obj}
        if was_shown:
            # SECURITY: DESIGN §4.3 — the object left scope: the client drops it, and sees
            # nothing of its new state.
            self.shown.discard(key)
            return {"type": "DELETED", "object": _stub(obj)}
        return None


async def scoped_chunks(
    info: RequestInfo, body: AsyncIterator[bytes], keep: _Keep, state: WatchFilter | None
) -> AsyncIterator[bytes] | Decision:
    """The filtered body of a successful upstream answer, as chunks to write.

    A get or list is read and filtered now, so that a get whose object left the driver's scope
    since the engine's read is still answered as absent: that 404 is returned as the request's
    Decision. A watch is filtered as it streams. Raises :class:`UpstreamError`.
    """
    if info.method == "HEAD":
        return _chunks([])
    state = state or WatchFilter(keep)
    if info.verb == "watch":
        return _watch(body, state)
    document = await _read_json(body, "response")
    if info.verb == "get":
        if not state.inside(document):
            qualified = f"{info.resource}.{info.api_group}" if info.api_group else info.resource
            return not_found(info, qualified, OUT_OF_SCOPE)
        return _chunks([_dump(document)])
    items = document.get("items")
    if not isinstance(items, list):
        # A Table or any other shape: never passed on unfiltered.
        raise UpstreamError(502, f"upstream answered a {document.get('kind')!r}, not a list")
    document["items"] = [item for item in items if state.inside(item)]
    if isinstance(document.get("metadata"), dict):
        document["metadata"].pop("remainingItemCount", None)
    return _chunks([_dump(document)])


async def prime_watch(upstream: Upstream, info: RequestInfo, keep: _Keep) -> WatchFilter:
    """The state of a watch that continues a list at ``resourceVersion``.

    The client holds what its list (filtered the same way) returned at that version, so that
    is read again, exactly at that version: an object of that list that leaves scope during
    the watch is then sent as DELETED. Without a resourceVersion to continue from, the watch
    starts with ADDED events and the state builds itself.
    """
    rv = info.query_value("resourceVersion")
    if not rv or rv == "0" or info.query_value("sendInitialEvents") in _TRUE:
        return WatchFilter(keep)
    listing = info.as_list(("labelSelector", "fieldSelector"))
    listing = listing.with_query("resourceVersion", rv).with_query("resourceVersionMatch", "Exact")
    headers = {"Accept": PLAIN_JSON}
    async with upstream.stream("GET", listing.target, headers, None, long_running=False) as answer:
        if answer.status != 200:
            return WatchFilter(keep)  # the watch itself will answer (410 Expired, most likely)
        document = await _read_json(answer.chunks(), "list")
    items = document.get("items")
    state = WatchFilter(keep)
    if isinstance(items, list):
        state.shown = {_key(item) for item in items if state.inside(item)}
        state.dropped.clear()  # reported by the list that showed them, not again here
    return state


async def _watch(body: AsyncIterator[bytes], state: WatchFilter) -> AsyncIterator[bytes]:
    try:
        async for line in _lines(body, MAX_WATCH_LINE):
            try:
                event = parse_bounded(line, limit=MAX_OBJECT_DEPTH)
            except ValueError:
                yield _error_event("the gatekeeper could not read an upstream watch event")
                return
            out = state.event(event)
            if out is event:
                yield line + b"\n"
            elif out is not None:
                yield _dump(out) + b"\n"
    except _LineTooLong:
        yield _error_event(f"an upstream watch event exceeds {MAX_WATCH_LINE} bytes")


class _LineTooLong(Exception):
    pass


async def _lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """Newline-delimited lines of ``chunks``, each at most ``limit`` bytes; blank ones skipped."""
    buffer = bytearray()
    async for chunk in chunks:
        scanned = len(buffer)
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", scanned)) >= 0:
            line = bytes(buffer[start:end])
            if line.strip():
                yield line
            start = scanned = end + 1
        del buffer[:start]
        if len(buffer) > limit:
            raise _LineTooLong
    if bytes(buffer).strip():
        yield bytes(buffer)


async def _read_json(body: AsyncIterator[bytes], what: str) -> KubeObject:
    # Parsed at any depth: an object too deep to evaluate is dropped on its own (inside()).
    return await read_json_object(
        body,
        f"filtered {what}",
        limit=MAX_FILTERED_BODY,
        too_large=", the most the gatekeeper filters in memory: list in pages (limit=)",
        max_depth=None,
    )


def _key(obj: KubeObject) -> _Key:
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _stub(obj: KubeObject) -> KubeObject:
    """What a DELETED event for an object that left scope shows: its identity only."""
    meta = raw if isinstance(raw := obj.get("metadata"), dict) else {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}


def _error_event(message: str) -> bytes:
    return _dump({"type": "ERROR", "object": status_body(500, message)}) + b"\n"


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


async def _chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
