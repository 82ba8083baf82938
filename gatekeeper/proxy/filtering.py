"""Responses of kinds scoped object by object (ResourceClaims): filtered before the driver sees
them (DESIGN §4.3). The engine's Decision carries the pure predicate; this module applies it.

Nothing about an object out of scope reaches the driver, in any field (docs/operating.md,
"Filtered reads"):

- get: the object, or 404 when it is out of scope (existence is not revealed);
- list: read from the upstream in pages of :data:`~gatekeeper.proxy.paging.PAGE_SIZE` that the
  gatekeeper follows itself, one item at a time, and answered in full as one list carrying
  ``kind``, ``apiVersion``, ``metadata.resourceVersion`` and the items in scope, nothing else
  (:mod:`gatekeeper.proxy.paging`; shared by identical requests, :mod:`gatekeeper.proxy.listing`);
- watch: event by event, line by line (at most :data:`MAX_WATCH_LINE` bytes per event). An
  object that leaves scope is sent once as ``DELETED`` (metadata only), one that enters it as
  ``ADDED``; ``BOOKMARK`` and ``ERROR`` events are rebuilt from the fields they need;
- an error answer: the Status rebuilt from its code, reason, message and details, without its
  ``metadata`` (a 410 for an expired continue token carries a new token).

The upstream is always asked for plain JSON: a ``Table`` or ``PartialObjectMetadata`` lacks
what the scope needs, so it is never passed on unfiltered.

An object the gatekeeper cannot evaluate (nested deeper than
:data:`~gatekeeper.codec.jsonbounds.MAX_OBJECT_DEPTH`, or a shape the scope cannot read) is dropped:
fail closed for that object alone, counted in :data:`~gatekeeper.proxy.scoped.DROPPED`, logged,
and listed on the request's audit event; the rest of the list or watch goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gatekeeper.codec import jsoncodec
from gatekeeper.codec.jsonbounds import MAX_OBJECT_DEPTH, parse_bounded
from gatekeeper.policy.claims import OUT_OF_SCOPE
from gatekeeper.policy.decision import Decision, not_found
from gatekeeper.proxy.paging import MAX_FILTERED_OBJECT
from gatekeeper.proxy.scoped import WatchFilter, scoped_error
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.status import status_body
from gatekeeper.types import KubeObject
from gatekeeper.upstream.session import read_json_object

__all__ = ["MAX_WATCH_LINE", "PLAIN_JSON", "scoped_chunks", "scoped_error"]

PLAIN_JSON = "application/json"
MAX_WATCH_LINE = 8 * 1024 * 1024
"""One watch event (one line) at most; an object is at most ~1.5 MiB in etcd."""


async def scoped_chunks(
    info: RequestInfo, body: AsyncIterator[bytes], state: WatchFilter
) -> AsyncIterator[bytes] | Decision:
    """The filtered body of a successful upstream answer to a get or watch, as chunks to write.

    A get is read and filtered now, so that a get whose object left the driver's scope since
    the engine's read is still answered as absent: that 404 is returned as the request's
    Decision. A watch is filtered as it streams, from ``state`` (primed by the list it
    continues, if any). Lists are read whole (:func:`~gatekeeper.proxy.paging.read_list`).
    Raises :class:`~gatekeeper.errors.UpstreamError`.
    """
    if info.method == "HEAD":
        return _chunks([])
    if info.verb == "watch":
        return _watch(body, state)
    if info.verb != "get":
        # Fail closed: nothing unfiltered passes for a verb this filter does not know.
        raise ValueError(f"a filtered {info.verb} is not read here")
    document = await _read_object(body)
    if not state.inside(document):
        qualified = f"{info.resource}.{info.api_group}" if info.api_group else info.resource
        return not_found(info, qualified, OUT_OF_SCOPE)
    return _chunks([_dump(document)])


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


async def _read_object(body: AsyncIterator[bytes]) -> KubeObject:
    # Parsed at any depth: an object too deep to evaluate is dropped on its own (inside()).
    return await read_json_object(
        body, "filtered response", limit=MAX_FILTERED_OBJECT, max_depth=None
    )


def _error_event(message: str) -> bytes:
    return _dump({"type": "ERROR", "object": status_body(500, message)}) + b"\n"


def _dump(obj: Any) -> bytes:
    return jsoncodec.dumps(obj)


async def _chunks(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
