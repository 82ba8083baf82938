"""What of an upstream object or event reaches a driver, for kinds scoped object by object
(DESIGN §4.3): the scope state of one read (:class:`WatchFilter`), and the rebuilt forms of
what passes without being scoped: a BOOKMARK's object, an error Status, the identity of an
object that left scope. Nothing is passed on as the upstream wrote it unless it is an object
in scope.

An object the gatekeeper cannot evaluate (nested deeper than
:data:`~gatekeeper.codec.jsonbounds.MAX_OBJECT_DEPTH`, or a shape the scope cannot read) is dropped:
fail closed for that object alone, counted in :data:`DROPPED`, logged, and listed on the
request's audit event; the rest of the list or watch goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from gatekeeper.codec import jsoncodec
from gatekeeper.codec.jsonbounds import MAX_OBJECT_DEPTH, within_depth
from gatekeeper.status import status_body
from gatekeeper.types import KubeObject

__all__ = [
    "DROPPED",
    "DROPPED_ANNOTATION",
    "Keep",
    "WatchFilter",
    "dropped_annotation",
    "key_of",
    "rebuilt_status",
    "scoped_error",
]

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

Keep = Callable[[KubeObject], bool]
"""The scope's predicate (the engine Decision's ``filter``)."""
_Key = tuple[str, str]
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_STATUS_DETAILS = ("name", "group", "kind", "causes", "retryAfterSeconds")


class WatchFilter:
    """Per-watch state: which objects the driver has been shown as in scope."""

    def __init__(self, keep: Keep, shown: set[_Key] | None = None) -> None:
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
        namespace, name = key_of(obj) if isinstance(obj, dict) else ("", "")
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
        return dropped_annotation(self.dropped)

    def event(self, event: Any) -> Any | None:
        """The event to send for upstream ``event`` (maybe retyped), or None to drop it."""
        if not isinstance(event, dict):
            return None
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            return None
        if kind == "BOOKMARK":
            return {"type": "BOOKMARK", "object": _bookmark(obj)}
        if kind == "ERROR":
            return {"type": "ERROR", "object": rebuilt_status(obj, 500)}
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return None  # fail closed on anything this filter does not understand
        key = key_of(obj)
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


def dropped_annotation(dropped: Sequence[str]) -> str:
    """The audit annotation value (:data:`DROPPED_ANNOTATION`) for the objects ``dropped``:
    how many, and the first few."""
    shown = ", ".join(dropped[:5]) + (", ..." if len(dropped) > 5 else "")
    return f"{len(dropped)}: {shown}"


def key_of(obj: KubeObject) -> _Key:
    """``(namespace, name)`` of an object: what a client keys it by."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _stub(obj: KubeObject) -> KubeObject:
    """What a DELETED event for an object that left scope shows: its identity only."""
    meta = raw if isinstance(raw := obj.get("metadata"), dict) else {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept}


def _bookmark(obj: KubeObject) -> KubeObject:
    """A BOOKMARK's object as a client reads it: its resourceVersion (and the end-of-initial-
    events annotation), nothing else."""
    meta = raw if isinstance(raw := obj.get("metadata"), dict) else {}
    kept: KubeObject = {}
    if isinstance(rv := meta.get("resourceVersion"), str):
        kept["resourceVersion"] = rv
    annotations = meta.get("annotations")
    if isinstance(annotations, dict) and annotations.get(_INITIAL_EVENTS_END) == "true":
        kept["annotations"] = {_INITIAL_EVENTS_END: "true"}
    return {"kind": obj.get("kind"), "apiVersion": obj.get("apiVersion"), "metadata": kept}


def rebuilt_status(obj: KubeObject, default_code: int) -> KubeObject:
    """A Status carrying only the code, reason, message and details of ``obj`` (an upstream
    Status: its metadata may hold a continue token that names a hidden object)."""
    raw_code = obj.get("code")
    code = raw_code if isinstance(raw_code, int) and 400 <= raw_code <= 599 else default_code
    message = obj.get("message")
    reason = obj.get("reason")
    details = raw if isinstance(raw := obj.get("details"), dict) else {}
    kept = {k: details[k] for k in _STATUS_DETAILS if k in details}
    return status_body(
        code,
        message if isinstance(message, str) else f"the upstream answered HTTP {code}",
        reason=reason if isinstance(reason, str) else None,
        details=kept or None,
    )


def scoped_error(head: bytes, code: int) -> bytes:
    """An upstream error answer to a filtered read, rebuilt from what a client needs of it
    (code, reason, message, details), so that nothing else of the upstream's reaches the driver
    (a 410 for an expired continue token names a new one in its metadata)."""
    try:
        status = jsoncodec.loads(head)
    except ValueError:
        status = None
    return jsoncodec.dumps(rebuilt_status(status if isinstance(status, dict) else {}, code))
