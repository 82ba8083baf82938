"""Filtered lists and watch primes, each read once for every identical request waiting for it
(docs/operating.md, "Filtered reads").

A driver's filtered list reads the whole of the upstream's list (:mod:`gatekeeper.proxy.paging`)
whatever it asks for, so its requests share reads (:mod:`gatekeeper.proxy.sharedreads`): one
read in flight per driver, scope and list (path, selectors, resourceVersion, …), the requests
that arrive meanwhile served together by the next. Each read takes one of the driver's
filtered-read turns (``--max-filtered-reads-per-driver``) while it runs, so a driver has at most
that many distinct lists read at once, however many requests wait for them.

Every request served from a read answers exactly what that read returned, with its
``metadata.resourceVersion``: a list served from a shared read is that read's.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager

from gatekeeper.proxy.budgets import DriverBudgets
from gatekeeper.proxy.paging import ListRead, PageOpener, read_list
from gatekeeper.proxy.scoped import Keep, WatchFilter
from gatekeeper.proxy.sharedreads import SharedReads
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.upstream.session import Upstream, UpstreamResponse

__all__ = ["FilteredReads", "ListReads", "ReadKey"]

ReadKey = tuple[str, Keep, str, tuple[tuple[str, str], ...]]
"""What makes two filtered reads the same: driver, scope, path and query (sorted)."""
ListReads = SharedReads[ReadKey, ListRead]
"""The process's shared filtered reads (one per gatekeeper)."""


class FilteredReads:
    """One request's filtered reads of lists: its driver, scope and upstream headers."""

    def __init__(
        self,
        reads: ListReads,
        budgets: DriverBudgets,
        upstream: Upstream,
        driver: str,
        keep: Keep,
        headers: Mapping[str, str],
    ) -> None:
        self._reads = reads
        self._budgets = budgets
        self._pages = _pages(upstream, dict(headers))
        self._driver = driver
        self._keep = keep

    async def listed(self, target: RequestInfo) -> ListRead:
        """The list ``target`` (a GET or HEAD of a collection, from
        :func:`~gatekeeper.proxy.paging.upstream_target`), filtered, from a shared read."""
        key: ReadKey = (self._driver, self._keep, target.path, tuple(sorted(target.query)))
        # A list at a resourceVersion accepts any read at or after it (the running one too);
        # without one it asks for the newest state, which only a read begun after it shows.
        at_version = bool(target.query_value("resourceVersion"))

        async def start() -> ListRead:
            # SECURITY: docs/operating.md "Filtered reads" — each read of the upstream's list
            # takes one of the driver's turns: its reads at once are bounded, not its requests.
            async with self._budgets.filtered_read(self._driver):
                return await read_list(self._pages, target, self._keep)

        return await self._reads.read(key, start, join_running=at_version)

    async def primed(self, listing: RequestInfo) -> WatchFilter:
        """The state of a watch that continues ``listing`` (from
        :func:`~gatekeeper.proxy.paging.prime_listing`): what that list showed. A list the
        upstream refuses (410 Expired, most likely) primes nothing: the watch itself answers."""
        read = await self.listed(listing)
        if read.status != 200:
            return WatchFilter(self._keep)
        return WatchFilter(self._keep, set(read.shown))


def _pages(upstream: Upstream, headers: dict[str, str]) -> PageOpener:
    """Opens the pages of a filtered list with the headers of the request that started it."""

    def page(info: RequestInfo) -> AbstractAsyncContextManager[UpstreamResponse]:
        return upstream.stream("GET", info.target, headers, None, pool="requests")

    return page
