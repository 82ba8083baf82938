"""Audit sinks: one JSON line per event, written off the event loop, nothing dropped.

``await sink.emit(event)`` returns at once while the bounded queue has room and waits (never
blocking the loop) when it is full: a slow disk slows requests down instead of losing events.
Events are serialized on the loop; a writer thread writes them. Write errors are logged, counted
and retried.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gatekeeper.audit.rotation import MEGABYTE, RotatingFile

__all__ = ["AuditSink", "JsonLinesWriter", "NullSink", "WriterStats"]

log = logging.getLogger("gatekeeper.audit")

_BATCH = 512
_COALESCE, _COALESCE_SECONDS = 64, 0.005
_RETRY_MIN, _RETRY_MAX = 0.05, 5.0


class AuditSink(Protocol):
    """Where events go. ``emit`` may wait for room; ``close``/``aclose`` flush everything.

    ``writable`` is False while events cannot be written: the proxy then refuses every request
    (503) rather than serve it unaudited (docs/operating.md#faults). Every sink says it; a
    sink that could not would be an interface error, never "writable".
    """

    @property
    def writable(self) -> bool: ...

    async def emit(self, event: dict[str, Any]) -> None: ...
    def close(self) -> None: ...
    async def aclose(self) -> None: ...


class NullSink:
    """Discards events (no --audit-log): always writable."""

    @property
    def writable(self) -> bool:
        return True

    async def emit(self, event: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


@dataclass(slots=True)
class WriterStats:
    """Counters for /metrics and for the log on shutdown."""

    emitted: int = 0
    written: int = 0
    write_errors: int = 0
    backpressure_waits: int = 0
    lost: int = 0
    """Events not written: only when the file still failed at the close deadline."""
    rotations: int = 0


class _BoundedQueue:
    """A deque shared by the event loop (producers) and the writer thread (consumer)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self.closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put_or_wait(self, item: bytes) -> asyncio.Future[None] | None:
        """Enqueue and return None, or (full) a future set when room may have appeared."""
        with self._cond:
            if len(self._items) < self.capacity:
                self._items.append(item)
                if len(self._items) == 1 or len(self._items) == _COALESCE:
                    self._cond.notify()
                return None
            self._cond.notify()  # full: the writer must not linger coalescing
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
            return future

    def force_put(self, item: bytes) -> None:
        """Enqueue past capacity (a cancelled producer must not lose its event)."""
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def take(self, limit: int) -> list[bytes]:
        """Up to ``limit`` items; waits while empty; [] once closed and drained."""
        with self._cond:
            while not self._items and not self.closed:
                self._cond.wait()
            if len(self._items) < _COALESCE and not self.closed:
                # Let a few more arrive: fewer wake-ups, fewer GIL hand-offs with the loop.
                self._cond.wait(_COALESCE_SECONDS)
            count = min(limit, len(self._items))
            batch = [self._items.popleft() for _ in range(count)]
            for _ in range(min(len(self._waiters), self.capacity - len(self._items))):
                loop, future = self._waiters.popleft()
                loop.call_soon_threadsafe(_wake, future)
            return batch

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class JsonLinesWriter:
    """Writes events as JSON lines to a file (rotated by size) or ``-`` (stdout).

    Construct it before listening: an unopenable file raises OSError. ``await emit(event)``
    from the event loop; ``close()`` (or ``await aclose()``) on shutdown writes every queued
    event before returning, retrying a failing file for up to ``close_timeout`` seconds.
    """

    def __init__(
        self,
        path: str,
        *,
        max_size_mb: float = 0,
        max_backups: int = 0,
        queue_size: int = 10_000,
        close_timeout: float = 30.0,
    ) -> None:
        self.path = path
        self.stats = WriterStats()
        self._file = RotatingFile(
            path, max_bytes=int(max_size_mb * MEGABYTE), max_backups=max_backups
        )
        self._queue = _BoundedQueue(queue_size)
        self._close_timeout = close_timeout
        self._deadline: float | None = None
        self._closed = False
        self.failing = False
        """Set while the file cannot be written (disk full, I/O error); cleared on success."""
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()
        # A daemon thread dies with the interpreter; flush anything left if close() was missed.
        atexit.register(self.close)

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def writable(self) -> bool:
        """False while the log cannot be written: the proxy then refuses requests (503)
        rather than serve them unaudited (docs/operating.md#faults)."""
        return not self.failing

    async def emit(self, event: dict[str, Any]) -> None:
        """Queue ``event``; waits without blocking the loop while the queue is full."""
        if self._closed:
            self.stats.lost += 1
            log.error("audit event after close, not written audit_id=%s", event.get("auditID"))
            return
        self.stats.emitted += 1
        # Serialized here, on the loop: a snapshot of the event, and the writer thread then
        # only writes bytes (no GIL contention with the loop for JSON encoding).
        line = _encode(event)
        waited = False
        while (future := self._queue.put_or_wait(line)) is not None:
            if not waited:
                self.stats.backpressure_waits += 1
                waited = True
            try:
                await future
            except asyncio.CancelledError:
                self._queue.force_put(line)
                raise

    def close(self) -> None:
        """Write everything queued, then close the file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._deadline = time.monotonic() + self._close_timeout
        self._queue.close()
        self._thread.join()
        try:
            self._file.close()
        except OSError as exc:
            log.error("audit log %s: close failed: %s", self.path, exc.strerror)
        self.stats.rotations = self._file.rotations
        if self.stats.lost:
            log.error("audit log %s: %d events could not be written", self.path, self.stats.lost)
        atexit.unregister(self.close)

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def _run(self) -> None:
        while batch := self._queue.take(_BATCH):
            self._file.add(batch)
            lost = self._retry_until_written()
            self.stats.written += len(batch) - lost
            self.stats.rotations = self._file.rotations
        self._retry_until_written()

    def _retry_until_written(self) -> int:
        """Write what is pending, retrying with backoff; gives up only past the close deadline.

        Returns how many lines were given up (counted in ``stats.lost``).
        """
        delay = _RETRY_MIN
        while self._file.pending:
            try:
                self._file.flush()
                self.failing = False
                return 0
            except OSError as exc:
                self.failing = True
                self.stats.write_errors += 1
                log.error(
                    "audit log %s: write failed (%s), %d events waiting; retrying in %.2fs",
                    self.path,
                    exc.strerror or exc,
                    self._file.pending + len(self._queue),
                    delay,
                )
                if self._deadline is not None and time.monotonic() > self._deadline:
                    lost = self._file.discard()
                    self.stats.lost += lost
                    return lost
                time.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
        return 0


def _encode(event: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(event, default=str, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # orjson.JSONEncodeError (a >64-bit integer): the standard library
        pass
    try:
        text = json.dumps(event, separators=(",", ":"), default=str)
    except (TypeError, ValueError) as exc:
        # Never drop the record of a request: keep what identifies it.
        stub = {k: event.get(k) for k in ("kind", "apiVersion", "auditID", "stage", "verb")}
        stub["annotations"] = {"dra-gatekeeper.io/error": f"event not serializable: {exc}"}
        text = json.dumps(stub, separators=(",", ":"), default=str)
    return text.encode() + b"\n"
