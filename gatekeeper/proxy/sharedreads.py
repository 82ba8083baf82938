"""Identical reads share one upstream read, at most one in flight per key (docs/operating.md,
"Filtered reads").

A request joins the read of its key that has not started yet, or starts one that begins when
the key's running read ends; so however many identical requests a driver sends, its key has
one read running and one waiting. A request never joins a read that started before it, unless
it says any result at or after a given resourceVersion will do (``join_running``): a list
without a resourceVersion asks for the newest state, and a read that began before the request
may miss a write the client has already seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["SharedReads"]

_K = TypeVar("_K", bound=Hashable)
_T = TypeVar("_T")


class _Read(Generic[_T]):
    """One upstream read and the requests waiting for it."""

    __slots__ = ("joinable", "task", "waiting")

    def __init__(self) -> None:
        self.task: asyncio.Task[_T | None] | None = None
        self.waiting = 0
        self.joinable = True


class _Slot(Generic[_T]):
    """A key's reads: the one running and the one that will run next."""

    __slots__ = ("pending", "running")

    def __init__(self) -> None:
        self.running: _Read[_T] | None = None
        self.pending: _Read[_T] | None = None


class SharedReads(Generic[_K, _T]):
    """Reads by key, each run once for every request that joined it (see the module)."""

    def __init__(self) -> None:
        self._slots: dict[_K, _Slot[_T]] = {}
        self.started = 0
        """Reads started (each one upstream read), since the process started."""
        self.requests = 0
        """Requests that waited for a read (``requests - started`` shared another's)."""

    def __len__(self) -> int:
        """Keys with a read running or waiting (each key's entry goes with its last read)."""
        return len(self._slots)

    def waiting(self) -> tuple[int, int]:
        """Requests waiting for a running read, and for one that has not begun (all keys)."""
        running = sum(slot.running.waiting for slot in self._slots.values() if slot.running)
        pending = sum(slot.pending.waiting for slot in self._slots.values() if slot.pending)
        return running, pending

    async def read(self, key: _K, start: Callable[[], Awaitable[_T]], *, join_running: bool) -> _T:
        """The result of ``key``'s next read (``start()``, called by the read that runs), or of
        its running one with ``join_running``. A request that leaves stops waiting; the read
        goes on for the others, and stops when none is left."""
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot()
        if join_running and slot.running is not None and slot.running.joinable:
            read = slot.running
        elif slot.pending is not None:
            read = slot.pending
        else:
            read = slot.pending = _Read()
            read.task = asyncio.create_task(self._run(key, slot, read, slot.running, start))
            read.task.add_done_callback(_retrieved)
        read.waiting += 1
        self.requests += 1
        assert read.task is not None
        try:
            result = await asyncio.shield(read.task)
        finally:
            read.waiting -= 1
            if read.waiting == 0 and read is slot.running and not read.task.done():
                # Nobody waits for it any more: its upstream connection and turn are freed.
                read.joinable = False
                read.task.cancel()
        if result is None:
            raise RuntimeError("a shared read ran without a request waiting for it")
        return result

    async def _run(
        self,
        key: _K,
        slot: _Slot[_T],
        read: _Read[_T],
        before: _Read[_T] | None,
        start: Callable[[], Awaitable[_T]],
    ) -> _T | None:
        try:
            if before is not None and before.task is not None:
                # One read in flight per key: this one begins when the running one has ended.
                await asyncio.wait([before.task])
            slot.pending = None
            slot.running = read
            if read.waiting == 0:
                return None  # every request that joined it has left
            self.started += 1
            return await start()
        finally:
            if slot.pending is read:
                slot.pending = None
            if slot.running is read:
                slot.running = None
            if slot.running is None and slot.pending is None and self._slots.get(key) is slot:
                del self._slots[key]


def _retrieved(task: asyncio.Task[object]) -> None:
    """Its requests read the outcome; this keeps asyncio from logging it as never retrieved
    when they all left first."""
    if not task.cancelled():
        task.exception()
