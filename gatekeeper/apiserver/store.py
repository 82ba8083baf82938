"""In-memory object store of the embedded API server: objects, resourceVersions, history, watchers.

One global resourceVersion counter (as etcd's revision) orders every write. Stored objects are
never mutated in place: a write stores a new dict, so readers and events may share them.
History is kept (bounded) for watches from a resourceVersion and for ``Exact`` lists;
:meth:`Store.compact` forgets it, after which older resourceVersions are "too old" (410).
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from gatekeeper.apiserver._types import KubeObject

__all__ = [
    "ADDED",
    "DELETED",
    "MODIFIED",
    "ObjectKey",
    "ResourceKey",
    "Store",
    "StoreEvent",
    "Watcher",
    "new_uid",
    "now_timestamp",
    "object_key",
]

ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"

ResourceKey = tuple[str, str]
"""``(group, resource)``: objects are stored once per group/resource, whatever the version."""

ObjectKey = tuple[str, str]
"""``(namespace, name)``; namespace is ``""`` for cluster-scoped kinds."""


def now_timestamp() -> str:
    """The current time as the apiserver writes timestamps (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_key(obj: KubeObject) -> ObjectKey:
    """``(namespace, name)`` from an object's metadata."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _etcd_order(key: ObjectKey) -> str:
    """Objects list in etcd key order: ``namespace/name`` (or ``name``) as a string."""
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """One write: ``obj`` is the state after it (a DELETED object carries the deletion rv)."""

    type: str
    rv: int
    resource: ResourceKey
    obj: KubeObject
    prev: KubeObject | None


@dataclass(eq=False, slots=True)
class Watcher:
    """A subscription to the writes of one group/resource; ``None`` in the queue ends it."""

    resource: ResourceKey
    queue: asyncio.Queue[StoreEvent | None]
    overflowed: bool = False
    closed: bool = False
    _store: Store | None = field(default=None, repr=False)

    def close(self) -> None:
        """Stop receiving events (idempotent)."""
        if self._store is not None:
            self._store.unsubscribe(self)


class Store:
    """Objects per group/resource with a global resourceVersion, history and watchers."""

    def __init__(
        self,
        resources: Iterable[ResourceKey],
        *,
        history_limit: int = 10_000,
        watch_queue_size: int = 1_000,
    ) -> None:
        self._objects: dict[ResourceKey, dict[ObjectKey, KubeObject]] = {
            key: {} for key in resources
        }
        self._rv = 0
        self._floor = 0
        self._history: deque[StoreEvent] = deque()
        self._history_limit = history_limit
        self._watch_queue_size = watch_queue_size
        self._watchers: set[Watcher] = set()
        self._rv_changed: asyncio.Event | None = None
        self.closed = False

    # --- reads -------------------------------------------------------------------------------

    @property
    def current_rv(self) -> int:
        """The resourceVersion of the latest write (0 before any)."""
        return self._rv

    @property
    def floor(self) -> int:
        """The oldest resourceVersion history is complete from (raised by :meth:`compact`)."""
        return self._floor

    @property
    def watcher_count(self) -> int:
        """Open watchers (tests check that disconnected clients do not leak)."""
        return len(self._watchers)

    def serves(self, resource: ResourceKey) -> bool:
        """Whether objects of ``resource`` are kept here."""
        return resource in self._objects

    def get(self, resource: ResourceKey, key: ObjectKey) -> KubeObject | None:
        """The stored object (shared: do not mutate), or None."""
        return self._objects[resource].get(key)

    def items(self, resource: ResourceKey, namespace: str | None = None) -> list[KubeObject]:
        """Current objects in key order (namespace, name), optionally of one namespace."""
        objects = self._objects[resource]
        return [
            objects[key]
            for key in sorted(objects, key=_etcd_order)
            if namespace is None or key[0] == namespace
        ]

    def snapshot(
        self, resource: ResourceKey, rv: int, namespace: str | None = None
    ) -> list[KubeObject]:
        """Objects as they were at ``rv`` (``floor <= rv <= current_rv``), in key order."""
        if rv < self._floor or rv > self._rv:
            raise ValueError(f"resourceVersion {rv} is outside [{self._floor}, {self._rv}]")
        state = dict(self._objects[resource])
        for event in reversed(self._history):
            if event.rv <= rv:
                break
            if event.resource != resource:
                continue
            key = object_key(event.obj)
            if event.prev is None:
                state.pop(key, None)
            else:
                state[key] = event.prev
        return [
            state[key]
            for key in sorted(state, key=_etcd_order)
            if namespace is None or key[0] == namespace
        ]

    def events_since(self, resource: ResourceKey, rv: int) -> list[StoreEvent]:
        """Writes to ``resource`` after ``rv`` (``rv >= floor``), oldest first."""
        if rv < self._floor:
            raise ValueError(f"resourceVersion {rv} is older than {self._floor}")
        return [e for e in self._history if e.rv > rv and e.resource == resource]

    async def wait_for_rv(self, rv: int, timeout: float) -> bool:
        """Wait until ``current_rv >= rv``; False if ``timeout`` passes first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        while self._rv < rv and not self.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            if self._rv_changed is None:
                self._rv_changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._rv_changed.wait(), remaining)
            except TimeoutError:
                return False
        return self._rv >= rv

    # --- writes ------------------------------------------------------------------------------

    def create(self, resource: ResourceKey, obj: KubeObject) -> KubeObject:
        """Store a new object (the caller checked it is absent); assigns the next rv."""
        stored = self._with_rv(obj, self._next_rv())
        self._objects[resource][object_key(stored)] = stored
        self._record(ADDED, resource, stored, None)
        return stored

    def replace(self, resource: ResourceKey, obj: KubeObject) -> KubeObject:
        """Replace an existing object; assigns the next rv."""
        key = object_key(obj)
        prev = self._objects[resource][key]
        stored = self._with_rv(obj, self._next_rv())
        self._objects[resource][key] = stored
        self._record(MODIFIED, resource, stored, prev)
        return stored

    def delete(
        self, resource: ResourceKey, key: ObjectKey, *, final: KubeObject | None = None
    ) -> KubeObject:
        """Remove an object; returns it (or ``final``, its last state) at the deletion rv."""
        prev = self._objects[resource].pop(key)
        gone = self._with_rv(final if final is not None else prev, self._next_rv())
        self._record(DELETED, resource, gone, prev)
        return gone

    def advance_rv(self, rv: int) -> None:
        """Move the resourceVersion counter forward to ``rv`` (as writes to resources this
        store does not hold would); never backwards."""
        if rv > self._rv:
            self._rv = rv - 1
            self._next_rv()

    def compact(self) -> None:
        """Forget all history: resourceVersions before now become too old."""
        self._history.clear()
        self._floor = self._rv

    # --- watchers ----------------------------------------------------------------------------

    def subscribe(self, resource: ResourceKey) -> Watcher:
        """A watcher receiving every later write to ``resource``."""
        watcher = Watcher(resource, asyncio.Queue(self._watch_queue_size), _store=self)
        if self.closed:
            watcher.closed = True
            watcher.queue.put_nowait(None)
        else:
            self._watchers.add(watcher)
        return watcher

    def unsubscribe(self, watcher: Watcher) -> None:
        """Detach ``watcher`` (idempotent)."""
        watcher.closed = True
        self._watchers.discard(watcher)

    def close(self) -> None:
        """End every watcher promptly and refuse new ones."""
        self.closed = True
        for watcher in list(self._watchers):
            self.unsubscribe(watcher)
            try:
                watcher.queue.put_nowait(None)
            except asyncio.QueueFull:
                watcher.overflowed = True
        if self._rv_changed is not None:
            self._rv_changed.set()

    # --- internals ---------------------------------------------------------------------------

    def _next_rv(self) -> int:
        self._rv += 1
        if self._rv_changed is not None:
            self._rv_changed.set()
            self._rv_changed = None
        return self._rv

    @staticmethod
    def _with_rv(obj: KubeObject, rv: int) -> KubeObject:
        """A shallow copy with ``metadata.resourceVersion`` set (placed after ``uid``)."""
        meta: dict[str, object] = {}
        for key, value in (obj.get("metadata") or {}).items():
            if key != "resourceVersion":
                meta[key] = value
            if key == "uid":
                meta["resourceVersion"] = str(rv)
        meta.setdefault("resourceVersion", str(rv))
        out = copy.copy(obj)
        out["metadata"] = meta
        return out

    def _record(
        self, kind: str, resource: ResourceKey, obj: KubeObject, prev: KubeObject | None
    ) -> None:
        event = StoreEvent(kind, int(obj["metadata"]["resourceVersion"]), resource, obj, prev)
        if len(self._history) >= self._history_limit:
            self._floor = self._history.popleft().rv
        self._history.append(event)
        for watcher in list(self._watchers):
            if watcher.resource != resource:
                continue
            try:
                watcher.queue.put_nowait(event)
            except asyncio.QueueFull:
                # A watcher too slow to keep up is ended, as the apiserver's cacher does.
                watcher.overflowed = True
                self.unsubscribe(watcher)


def new_uid() -> str:
    """A fresh ``metadata.uid``."""
    return str(uuid.uuid4())
