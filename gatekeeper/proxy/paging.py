"""Filtered lists read page by page and item by item, answered in full (README, "Filtered
reads").

The gatekeeper asks the upstream for pages of :data:`PAGE_SIZE` whatever ``limit`` the driver
sent, follows the upstream's continue tokens itself, and streams one list to the driver: the
items in scope, read one at a time (:mod:`gatekeeper.codec.jsonstream`), under the first page's
``kind``, ``apiVersion`` and ``metadata.resourceVersion`` — nothing else of the list's own
fields. The apiserver's continue token names the last key of its page, which with ``limit=1``
is the very object the gatekeeper hid; ``remainingItemCount`` counts hidden objects. A server
may ignore ``limit`` (API conventions), and client-go's pager ends at an answer without a
continue token, so a reflector listing with ``limit=500`` gets everything in one answer.

A watch that continues a list re-reads that list the same way (:func:`prime_watch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

from gatekeeper.codec import jsoncodec
from gatekeeper.codec.jsonstream import Item, ListReader
from gatekeeper.errors import UpstreamError
from gatekeeper.proxy.scoped import Keep, WatchFilter, key_of
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import KubeObject
from gatekeeper.upstream.session import UpstreamResponse

__all__ = [
    "MAX_FILTERED_OBJECT",
    "PAGE_SIZE",
    "PageOpener",
    "filtered_list",
    "prime_listing",
    "prime_watch",
    "upstream_target",
]

PAGE_SIZE = 500
"""Items per upstream page of a filtered list (client-go's own page size)."""
MAX_FILTERED_OBJECT = 8 * 1024 * 1024
"""One object of a filtered get or list at most (etcd stores at most ~1.5 MiB); else 502."""

_SLICE = 16 * 1024
"""Bytes of upstream text parsed between two yields to the event loop (~0.2 ms of work)."""

PageOpener = Callable[[RequestInfo], AbstractAsyncContextManager[UpstreamResponse]]
"""Opens one more upstream page of a list (a GET of the given target)."""

_TRUE = frozenset({"1", "t", "T", "true", "True", "TRUE"})


async def filtered_list(
    info: RequestInfo,
    body: AsyncIterator[bytes],
    state: WatchFilter,
    pages: PageOpener | None,
) -> AsyncIterator[bytes]:
    """The driver's answer to list ``info``, whose first upstream page arrives as ``body``.

    Read now up to where its items begin, so that an answer that is not a list is a 502
    (UpstreamError) before anything is sent; the rest streams.
    """
    chunks = body.__aiter__()
    reader = ListReader(MAX_FILTERED_OBJECT)
    writer = _ItemWriter(state)
    pending = await _until_items(reader, chunks, writer)
    return _list(info, reader, chunks, pending, writer, pages)


def upstream_target(info: RequestInfo) -> RequestInfo:
    """What is asked of the upstream for a filtered read: a list's first page of
    :data:`PAGE_SIZE` (whatever ``limit`` the driver asked for), else the request itself."""
    return info.with_query("limit", str(PAGE_SIZE)) if info.verb == "list" else info


def prime_listing(info: RequestInfo) -> RequestInfo | None:
    """The list a watch must re-read before it streams (:func:`prime_watch`), or None when it
    continues no list (no resourceVersion, ``0``, or initial events sent by the upstream)."""
    rv = info.query_value("resourceVersion")
    if not rv or rv == "0" or info.query_value("sendInitialEvents") in _TRUE:
        return None
    listing = info.as_list(("labelSelector", "fieldSelector"))
    listing = listing.with_query("resourceVersion", rv).with_query("resourceVersionMatch", "Exact")
    return upstream_target(listing)


async def prime_watch(pages: PageOpener, listing: RequestInfo, keep: Keep) -> WatchFilter:
    """The state of a watch that continues a list at a resourceVersion (``listing``, from
    :func:`prime_listing`).

    The client holds what its list (filtered the same way) returned at that version, so that
    is read again, exactly at that version, page by page and one item at a time: an object of
    that list that leaves scope during the watch is then sent as DELETED. A watch without a
    list to continue starts with ADDED events and its state builds itself.
    """
    state = WatchFilter(keep)
    page: RequestInfo | None = listing
    while page is not None:
        reader = ListReader(MAX_FILTERED_OBJECT)
        async with pages(page) as answer:
            if answer.status != 200 and page is listing:
                return state  # the watch itself will answer (410 Expired, most likely)
            _check_page(answer)
            async for _ in _page(reader, answer.chunks(), _ItemWriter(state, remember=True)):
                pass
        page = _next_page(listing, reader, page)
    state.dropped.clear()  # reported by the list that showed them, not again here
    return state


async def _until_items(
    reader: ListReader, chunks: AsyncIterator[bytes], writer: _ItemWriter
) -> bytes:
    """Feed ``reader`` until the items begin (502 if the document is not a list); the kept
    items of what was read."""
    kept = b""
    try:
        while not reader.saw_items and not reader.done:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                kept += writer.take(reader.end())
                break
            for piece in _pieces(chunk):
                kept += writer.take(reader.feed(piece))
                await asyncio.sleep(0)
    except ValueError as exc:
        raise UpstreamError(502, f"upstream sent an invalid list: {exc}") from None
    if not reader.saw_items:
        # A Table or any other shape: never passed on unfiltered.
        kind = reader.members.get("kind")
        raise UpstreamError(502, f"upstream answered a {kind!r}, not a list")
    return kept


async def _list(
    info: RequestInfo,
    reader: ListReader,
    chunks: AsyncIterator[bytes],
    pending: bytes,
    writer: _ItemWriter,
    pages: PageOpener | None,
) -> AsyncIterator[bytes]:
    """One list in scope, whatever the upstream's pages: head, kept items, then the rest."""
    # SECURITY: README "Filtered reads" — of the list's own fields only these three reach
    # the driver; continue and remainingItemCount would name or count hidden objects.
    first = reader
    head: KubeObject = {k: first.members[k] for k in ("kind", "apiVersion") if k in first.members}
    meta_early = "metadata" in first.members
    if meta_early:
        head["metadata"] = _list_meta(first.members)
    yield _dump(head)[:-1] + (b',"items":[' if head else b'"items":[') + pending
    async for out in _page(reader, chunks, writer):
        yield out
    page = _next_page(info, reader, info)
    while page is not None:
        if pages is None:
            raise UpstreamError(502, "the upstream list has more pages than were read")
        reader = ListReader(MAX_FILTERED_OBJECT)
        async with pages(page) as answer:
            _check_page(answer)
            async for out in _page(reader, answer.chunks(), writer):
                yield out
        page = _next_page(info, reader, page)
    tail = b"]"
    if not meta_early:
        tail += b',"metadata":' + _dump(_list_meta(first.members))
    yield tail + b"}"


async def _page(
    reader: ListReader, chunks: AsyncIterator[bytes], writer: _ItemWriter
) -> AsyncIterator[bytes]:
    """The rest of one upstream page through ``reader``: the kept items' text."""
    try:
        async for chunk in chunks:
            for piece in _pieces(chunk):
                if out := writer.take(reader.feed(piece)):
                    yield out
                # SECURITY: README "Filtered reads" — a slice of text at a time, then the
                # other drivers' requests get the loop: no list holds it for long.
                await asyncio.sleep(0)
        if out := writer.take(reader.end()):
            yield out
    except ValueError as exc:
        raise UpstreamError(502, f"upstream sent an invalid list: {exc}") from None
    if not reader.saw_items:
        raise UpstreamError(502, "a page of the upstream list holds no items")


def _pieces(chunk: bytes) -> Iterator[bytes]:
    """``chunk`` in slices of at most :data:`_SLICE` bytes (a read may return far more)."""
    for start in range(0, len(chunk), _SLICE):
        yield chunk[start : start + _SLICE]


class _ItemWriter:
    """Takes a page's items one at a time: the text of those in scope, comma-separated across
    pages; or, for a watch's prime (``remember``), only their keys."""

    def __init__(self, state: WatchFilter, *, remember: bool = False) -> None:
        self.state = state
        self.remember = remember
        self.first = True

    def take(self, items: Iterable[Item]) -> bytes:
        inside = self.state.inside
        if self.remember:
            self.state.shown.update(key_of(item.value) for item in items if inside(item.value))
            return b""
        texts = [item.text for item in items if inside(item.value)]
        if not texts:
            return b""
        joined = ",".join(texts).encode()
        if self.first:
            self.first = False
            return joined
        return b"," + joined


def _list_meta(members: dict[str, Any]) -> KubeObject:
    meta = members.get("metadata")
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return {"resourceVersion": rv} if isinstance(rv, str) else {}


def _next_page(first: RequestInfo, reader: ListReader, current: RequestInfo) -> RequestInfo | None:
    """The next upstream page after the one ``reader`` read, or None when it was the last."""
    meta = reader.members.get("metadata")
    token = meta.get("continue") if isinstance(meta, dict) else None
    if not isinstance(token, str) or not token:
        return None
    if token == current.query_value("continue"):
        raise UpstreamError(502, "the upstream list repeated its continue token")
    # The apiserver refuses a resourceVersion beside a continue token: the token holds it.
    page = upstream_target(first).with_query("resourceVersion", None)
    return page.with_query("resourceVersionMatch", None).with_query("continue", token)


def _check_page(answer: UpstreamResponse) -> None:
    if answer.status != 200:
        # Mid-list: the status line is already sent, so the driver's connection is broken and
        # its client lists again (e.g. a continue token that expired: 410).
        raise UpstreamError(502, f"the upstream failed a page of a filtered list: {answer.status}")


def _dump(obj: Any) -> bytes:
    return jsoncodec.dumps(obj)
