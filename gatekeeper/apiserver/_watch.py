"""Watch streams as the apiserver writes them: chunked JSON, one event per line, flushed per event.

Semantics follow the watch cache: with a selector, an object that stops matching is sent as
``DELETED`` (its previous state at the new resourceVersion) and one that starts matching as
``ADDED``; a too-old resourceVersion is HTTP 200 with a single ``ERROR`` event carrying a 410
Status (recording 105). Bookmark objects carry only ``kind``, ``apiVersion`` and ``metadata``
(a deliberate difference: the apiserver also serializes the kind's zero-valued fields).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gatekeeper.apiserver._json import dumps
from gatekeeper.apiserver._list import ListOptions, matcher
from gatekeeper.apiserver._negotiate import JSON, PARTIAL, TABLE, Negotiated
from gatekeeper.apiserver._render import render_list, render_object
from gatekeeper.apiserver._routing import Target
from gatekeeper.apiserver._status import status_body
from gatekeeper.apiserver._types import KubeObject
from gatekeeper.apiserver.store import ADDED, DELETED, MODIFIED, Store, StoreEvent, Watcher

__all__ = ["DEFAULT_WATCH_TIMEOUT", "convert_event", "serve_watch"]

DEFAULT_WATCH_TIMEOUT = 1800
"""Seconds a watch without ``timeoutSeconds`` lasts (the apiserver picks 30 to 60 minutes)."""

_TICK = 0.5  # how often an idle watch checks for a vanished client


def convert_event(
    event: StoreEvent, matches: Callable[[KubeObject], bool]
) -> tuple[str, KubeObject] | None:
    """The event a filtered watcher sees for a store write, or None (the watch cache's rules)."""
    current = event.type != DELETED and matches(event.obj)
    previous = event.prev is not None and matches(event.prev)
    if current:
        return (MODIFIED if previous else ADDED), event.obj
    if previous and event.prev is not None:
        meta = dict(event.prev.get("metadata") or {}, resourceVersion=str(event.rv))
        return DELETED, {**event.prev, "metadata": meta}
    return None


class _Stream:
    """Writes watch events for one request, rendered as negotiated."""

    def __init__(self, response: web.StreamResponse, target: Target, neg: Negotiated) -> None:
        self.response, self.target, self.neg = response, target, neg

    async def send(self, kind: str, obj: KubeObject) -> None:
        rendered = render_object(self.target.kind, self.target.version, obj, self.neg)
        await self._write({"type": kind, "object": rendered})

    async def bookmark(self, rv: int, *, initial_end: bool = False) -> None:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        kind, version = self.target.kind, self.target.version
        obj: KubeObject
        if self.neg.mode == TABLE:
            obj = render_list(kind, version, [], meta, self.neg)
        elif self.neg.mode == PARTIAL:
            obj = render_object(kind, version, {"metadata": meta}, self.neg)
        else:
            obj = {"kind": kind.kind, "apiVersion": kind.group_version(version), "metadata": meta}
        await self._write({"type": "BOOKMARK", "object": obj})

    async def error(self, body: KubeObject) -> None:
        await self._write({"type": "ERROR", "object": body})

    async def _write(self, event: dict[str, Any]) -> None:
        await self.response.write(dumps(event).encode() + b"\n")


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _initial(
    stream: _Stream, store: Store, target: Target, opts: ListOptions, matches: Any
) -> int:
    """Send what precedes live events; returns the resourceVersion live events start after."""
    rv_text = opts.resource_version
    if opts.send_initial_events or rv_text in ("", "0"):
        start_rv = store.current_rv
        for obj in store.items(target.resource_key, target.namespace or None):
            if matches(obj):
                await stream.send(ADDED, obj)
        if opts.send_initial_events and opts.allow_bookmarks:
            await stream.bookmark(start_rv, initial_end=True)
        return start_rv
    start_rv = int(rv_text)
    replay, seen_rv = store.events_since(target.resource_key, start_rv), store.current_rv
    for event in replay:
        converted = convert_event(event, matches)
        if converted is not None:
            await stream.send(*converted)
    return max(start_rv, seen_rv)


async def _live(
    request: web.Request,
    stream: _Stream,
    watcher: Watcher,
    store: Store,
    opts: ListOptions,
    matches: Any,
    *,
    after_rv: int,
    bookmark_interval: float,
) -> None:
    loop = asyncio.get_running_loop()
    timeout = opts.timeout_seconds if opts.timeout_seconds else DEFAULT_WATCH_TIMEOUT
    deadline = loop.time() + timeout
    next_bookmark = loop.time() + bookmark_interval
    while not watcher.overflowed:
        now = loop.time()
        if now >= deadline or _client_gone(request):
            return
        if opts.allow_bookmarks and now >= next_bookmark and watcher.queue.empty():
            # The queue is empty, so every write up to current_rv has been seen.
            await stream.bookmark(store.current_rv)
            next_bookmark = loop.time() + bookmark_interval
            continue
        if watcher.queue.empty():
            # Wait for an event, but wake for the deadline, the next bookmark (only when the
            # client asked for bookmarks: a due bookmark nobody sends must not make
            # the wait 0 for good) and, every tick, to notice a client that left.
            wait = min(deadline - now, _TICK)
            if opts.allow_bookmarks:
                wait = min(wait, next_bookmark - now)
            try:
                event = await asyncio.wait_for(watcher.queue.get(), max(wait, 0.001))
            except TimeoutError:
                continue
        else:
            event = watcher.queue.get_nowait()
        if event is None:
            return
        if event.rv <= after_rv:
            continue  # already covered by the initial state or the replayed history
        converted = convert_event(event, matches)
        if converted is not None:
            await stream.send(*converted)


async def serve_watch(
    request: web.Request,
    store: Store,
    target: Target,
    opts: ListOptions,
    neg: Negotiated,
    *,
    bookmark_interval: float = 1.0,
) -> web.StreamResponse:
    """Stream watch events until ``timeoutSeconds``, the client leaves, or the server closes."""
    watcher = store.subscribe(target.resource_key)  # before reading state: no gap
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    try:
        response.enable_chunked_encoding()
        await response.prepare(request)
        stream = _Stream(response, target, neg if neg.mode != JSON else Negotiated(JSON))
        rv_text = opts.resource_version
        if rv_text not in ("", "0") and not opts.send_initial_events and int(rv_text) < store.floor:
            message = f"too old resource version: {rv_text} ({store.floor})"
            await stream.error(status_body(410, message, reason="Expired"))
            await response.write_eof()
            return response
        matches = matcher(target, opts)
        after_rv = await _initial(stream, store, target, opts, matches)
        await _live(
            request,
            stream,
            watcher,
            store,
            opts,
            matches,
            after_rv=after_rv,
            bookmark_interval=bookmark_interval,
        )
        if not _client_gone(request):
            await response.write_eof()
        return response
    except ConnectionError:
        return response  # the client went away mid-write; nothing more to send
    finally:
        watcher.close()
