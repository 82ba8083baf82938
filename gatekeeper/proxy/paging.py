"""Filtered lists read page by page and item by item (docs/operating.md, "Filtered reads").

The gatekeeper asks the upstream for pages of :data:`PAGE_SIZE` whatever ``limit`` the driver
sent, follows the upstream's continue tokens itself, and makes one list of the items in scope,
read one at a time (:mod:`gatekeeper.codec.jsonstream`), under the first page's ``kind``,
``apiVersion`` and ``metadata.resourceVersion`` — nothing else of the list's own fields. The
apiserver's continue token names the last key of its page, which with ``limit=1`` is the very
object the gatekeeper hid; ``remainingItemCount`` counts hidden objects. A server may ignore
``limit`` (API conventions), and client-go's pager ends at an answer without a continue token,
so a reflector listing with ``limit=500`` gets everything in one answer.

:func:`read_list` is one such read, whole: the driver's answer (:class:`ListRead`) and the
keys of the objects in it, which a watch continuing that list starts from
(:func:`prime_listing`). Reads are shared by identical requests (:mod:`gatekeeper.proxy.listing`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from gatekeeper.codec import jsoncodec
from gatekeeper.codec.jsonstream import Item, ListReader
from gatekeeper.errors import UpstreamError
from gatekeeper.proxy.scoped import Keep, WatchFilter, key_of, scoped_error
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.upstream.session import UpstreamResponse

__all__ = [
    "MAX_FILTERED_ANSWER",
    "MAX_FILTERED_OBJECT",
    "PAGE_SIZE",
    "ListRead",
    "PageOpener",
    "prime_listing",
    "read_list",
    "upstream_target",
]

PAGE_SIZE = 500
"""Items per upstream page of a filtered list (client-go's own page size)."""
MAX_FILTERED_OBJECT = 8 * 1024 * 1024
"""One object of a filtered get or list at most (etcd stores at most ~1.5 MiB); else 502."""
MAX_FILTERED_ANSWER = 64 * 1024 * 1024
"""The objects in one driver's scope in one list at most (~17,000 claims of 3.6 KB), else 502:
a list is answered whole, so its answer is held in memory (once, however many share it)."""

_SLICE = 16 * 1024
"""Bytes of upstream text parsed between two yields to the event loop (~0.2 ms of work)."""
_MAX_ERROR = 64 * 1024
"""The most read of an upstream error answer (a Status)."""

PageOpener = Callable[[RequestInfo], AbstractAsyncContextManager[UpstreamResponse]]
"""Opens one upstream page of a list (a GET of the given target)."""

_TRUE = frozenset({"1", "t", "T", "true", "True", "TRUE"})
_Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class ListRead:
    """One filtered list read from the upstream, whole: what every request served from it
    answers (a :class:`UpstreamResponse` each, :meth:`answer`)."""

    status: int
    """The upstream's status for the first page (a later page failing is a 502 instead)."""
    headers: Mapping[str, str]
    """The upstream's response headers for the first page."""
    body: bytes
    """200: the list of the objects in scope; else the upstream's Status rebuilt from its code,
    reason, message and details (:func:`~gatekeeper.proxy.scoped.scoped_error`)."""
    shown: frozenset[_Key]
    """``(namespace, name)`` of the objects in ``body``: what a watch continuing it starts
    from."""
    dropped: tuple[str, ...] = ()
    """Objects left out as unevaluable (``namespace/name``, for the audit event)."""
    pages: int = 0
    """Upstream pages read."""

    def answer(self, method: str) -> AbstractAsyncContextManager[UpstreamResponse]:
        """This read as the upstream's answer to one request (no body for a HEAD)."""
        return _opened(_Replay(self, b"" if method == "HEAD" else self.body))


def upstream_target(info: RequestInfo) -> RequestInfo:
    """What is asked of the upstream for a filtered read: a list's first page of
    :data:`PAGE_SIZE` (whatever ``limit`` the driver asked for), else the request itself."""
    return info.with_query("limit", str(PAGE_SIZE)) if info.verb == "list" else info


def prime_listing(info: RequestInfo) -> RequestInfo | None:
    """The list a watch must re-read before it streams, or None when it continues no list (no
    resourceVersion, ``0``, or initial events sent by the upstream).

    The client holds what its list (filtered the same way) returned at that version, so that
    is read again, exactly at that version: an object of that list that leaves scope during
    the watch is then sent as DELETED (:attr:`ListRead.shown`). A watch without a list to
    continue starts with ADDED events and its state builds itself.
    """
    rv = info.query_value("resourceVersion")
    if not rv or rv == "0" or info.query_value("sendInitialEvents") in _TRUE:
        return None
    listing = info.as_list(("labelSelector", "fieldSelector"))
    listing = listing.with_query("resourceVersion", rv).with_query("resourceVersionMatch", "Exact")
    return upstream_target(listing)


async def read_list(pages: PageOpener, target: RequestInfo, keep: Keep) -> ListRead:
    """The list ``target`` (from :func:`upstream_target`) filtered by ``keep``, every upstream
    page of it read. Raises :class:`UpstreamError` (502) when the upstream answers anything but
    a list, fails a later page, or the objects in scope exceed :data:`MAX_FILTERED_ANSWER`."""
    kept = _Kept(WatchFilter(keep))
    first: ListReader | None = None
    headers: Mapping[str, str] = {}
    page: RequestInfo | None = target
    count = 0
    while page is not None:
        reader = ListReader(MAX_FILTERED_OBJECT)
        async with pages(page) as answer:
            count += 1
            if first is None:
                if answer.status >= 400:
                    # SECURITY: docs/operating.md "Filtered reads" — an upstream Status passes
                    # rebuilt: its metadata may hold a continue token naming a hidden object.
                    error = scoped_error(await answer.read(_MAX_ERROR), answer.status)
                    return ListRead(answer.status, _copy(answer.headers), error, frozenset())
                first, headers = reader, _copy(answer.headers)
            else:
                _check_page(answer)
            await _read_page(reader, answer.chunks(), kept, first=reader is first)
        page = _next_page(target, reader, page)
    assert first is not None
    body = kept.document(first.members)
    return ListRead(200, headers, body, frozenset(kept.keys), tuple(kept.state.dropped), count)


async def _read_page(
    reader: ListReader, chunks: AsyncIterator[bytes], kept: _Kept, *, first: bool
) -> None:
    """One upstream page through ``reader``, its items in scope taken by ``kept``."""
    try:
        async for chunk in chunks:
            for piece in _pieces(chunk):
                kept.take(reader.feed(piece))
                # SECURITY: docs/operating.md "Filtered reads" — a slice of text at a time,
                # then other requests get the loop: no list holds it for long.
                await asyncio.sleep(0)
        kept.take(reader.end())
    except ValueError as exc:
        raise UpstreamError(502, f"upstream sent an invalid list: {exc}") from None
    if not reader.saw_items:
        # A Table or any other shape: never passed on unfiltered.
        if first:
            kind = reader.members.get("kind")
            raise UpstreamError(502, f"upstream answered a {kind!r}, not a list")
        raise UpstreamError(502, "a page of the upstream list holds no items")


def _pieces(chunk: bytes) -> Iterator[bytes]:
    """``chunk`` in slices of at most :data:`_SLICE` bytes (a read may return far more)."""
    for start in range(0, len(chunk), _SLICE):
        yield chunk[start : start + _SLICE]


class _Kept:
    """The items in scope of a list's pages, as the upstream wrote them, and their keys."""

    def __init__(self, state: WatchFilter) -> None:
        self.state = state
        self.texts: list[str] = []
        self.keys: set[_Key] = set()
        self.size = 0

    def take(self, items: Iterable[Item]) -> None:
        inside = self.state.inside
        for item in items:
            if not inside(item.value):
                continue
            self.size += len(item.text)
            if self.size > MAX_FILTERED_ANSWER:
                raise UpstreamError(
                    502,
                    f"the objects in the driver's scope exceed {MAX_FILTERED_ANSWER} bytes in "
                    "one list",
                )
            self.texts.append(item.text)
            self.keys.add(key_of(item.value))

    def document(self, members: dict[str, Any]) -> bytes:
        """The driver's list: ``kind``, ``apiVersion``, ``metadata.resourceVersion``, items."""
        # SECURITY: docs/operating.md "Filtered reads" — of the list's own fields only these
        # three reach the driver; continue and remainingItemCount name or count hidden objects.
        head: dict[str, Any] = {k: members[k] for k in ("kind", "apiVersion") if k in members}
        head["metadata"] = _list_meta(members)
        items = ",".join(self.texts).encode()
        return jsoncodec.dumps(head)[:-1] + b',"items":[' + items + b"]}"


def _list_meta(members: dict[str, Any]) -> dict[str, Any]:
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
    page = first.with_query("resourceVersion", None)
    return page.with_query("resourceVersionMatch", None).with_query("continue", token)


def _check_page(answer: UpstreamResponse) -> None:
    if answer.status != 200:
        # E.g. a continue token that expired (410) while the list was read: the driver gets a
        # 502 and its client lists again.
        raise UpstreamError(502, f"the upstream failed a page of a filtered list: {answer.status}")


def _copy(headers: Mapping[str, str]) -> Mapping[str, str]:
    """The headers kept past the upstream response (a header may repeat, e.g. Warning)."""
    return CIMultiDictProxy(CIMultiDict(headers))


class _Replay:
    """A :class:`ListRead` as an :class:`UpstreamResponse`: its status, headers and body."""

    def __init__(self, read: ListRead, body: bytes) -> None:
        self._read = read
        self._body = body
        self._at = 0

    @property
    def status(self) -> int:
        return self._read.status

    @property
    def headers(self) -> Mapping[str, str]:
        return self._read.headers

    async def read(self, limit: int) -> bytes:
        data = self._body[self._at : self._at + limit]
        self._at += len(data)
        return data

    async def chunks(self) -> AsyncIterator[bytes]:
        # In slices: each request's transport buffers one slice at a time, not its own copy
        # of the whole answer.
        while self._at < len(self._body):
            yield await self.read(_SLICE * 4)


@asynccontextmanager
async def _opened(answer: UpstreamResponse) -> AsyncIterator[UpstreamResponse]:
    yield answer
