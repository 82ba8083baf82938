"""What a driver's writes of its own Node or Pod changed, from the logged bodies: the ``mayChange``
a proposed OwnNode or OwnPod rule needs (docs/policy.md, "mayChange")."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from gatekeeper.codec.jsonpath import MISSING, FieldPath, is_field_name
from gatekeeper.policy.changes import MAINTAINED
from gatekeeper.policy.model import Changeable

__all__ = ["Change", "changes_of", "may_change_doc"]

Change = tuple[FieldPath, str | None]
"""A path and the key of the map there that changed (None: the subtree at the path)."""

# Maps keyed by arbitrary strings (label and annotation keys): a change names the key.
_KEYED: frozenset[FieldPath] = frozenset({("metadata", "labels"), ("metadata", "annotations")})
# What a body carries without changing it (it names the object, or is a precondition), and what
# the apiserver maintains: never a driver's change.
_NOT_CHANGES: frozenset[FieldPath] = MAINTAINED | {
    ("apiVersion",),
    ("kind",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "uid"),
    ("metadata", "creationTimestamp"),
    ("metadata", "generation"),
}
# What mayChange cannot open (the loader refuses them): a change there stays refused.
_CLOSED: frozenset[FieldPath] = frozenset({(), ("metadata",)})


def changes_of(verb: str, body: Any, before: Any) -> set[Change] | None:
    """What an update or patch with ``body`` changed (``before``: the object the log last showed
    stored); None when the log cannot show it (no body, or an update whose object before it the
    log does not hold)."""
    if body is None:
        return None
    if verb == "update":
        if before is None or not isinstance(body, dict):
            return None
        return set(_diff(before, body, ()))
    if isinstance(body, list):
        return set(_json_patch(body))
    if isinstance(body, dict):
        return set(_merged(body, ()))
    return None


def _merged(body: dict[str, Any], path: FieldPath) -> Iterator[Change]:
    """A merge, strategic-merge or apply body: every field it sets or removes."""
    for key, value in body.items():
        here = (*path, key)
        if here in _NOT_CHANGES:
            continue
        if path in _KEYED:
            yield path, key
        elif not is_field_name(key):
            # A directive ($patch, $setElementOrder/…) rewrites the map it is in.
            yield (path, key) if path and not key.startswith("$") else (path, None)
        elif isinstance(value, dict):
            yield from _merged(value, here)
        else:
            yield here, None


def _diff(old: Any, new: Any, path: FieldPath) -> Iterator[Change]:
    """Every field that differs between the stored object and the one written."""
    if path in _NOT_CHANGES or _same(old, new):
        return
    before = {} if old is MISSING or old is None else old
    after = {} if new is MISSING or new is None else new
    if not (isinstance(before, dict) and isinstance(after, dict)):
        yield path, None
        return
    for key in sorted(set(before) | set(after), key=str):
        old_value, new_value = before.get(key, MISSING), after.get(key, MISSING)
        if _same(old_value, new_value):
            continue
        if path in _KEYED or not is_field_name(str(key)):
            yield path, str(key)
        else:
            yield from _diff(old_value, new_value, (*path, str(key)))


def _same(old: Any, new: Any) -> bool:
    return (None if old is MISSING else old) == (None if new is MISSING else new)


def _json_patch(operations: list[Any]) -> Iterator[Change]:
    for operation in operations:
        if not isinstance(operation, dict) or operation.get("op") == "test":
            continue
        pointers = [operation.get("path")]
        if operation.get("op") == "move":
            pointers.append(operation.get("from"))
        for pointer in pointers:
            if isinstance(pointer, str):
                yield from _pointed(pointer, operation.get("op"), operation.get("value"))


def _pointed(pointer: str, op: Any, value: Any) -> Iterator[Change]:
    steps = [s.replace("~1", "/").replace("~0", "~") for s in pointer.split("/")[1:]]
    path: FieldPath = ()
    for step in steps:
        if path in _KEYED:
            yield path, step
            return
        if not is_field_name(step):
            list_index = step.isdigit() or step == "-"
            yield (path, None) if list_index or not path else (path, step)
            return
        path = (*path, step)
        if path in _NOT_CHANGES:
            return
    if path in _KEYED and op in ("add", "replace") and isinstance(value, dict):
        yield from ((path, key) for key in value)  # the map as the patch sets it
    else:
        yield path, None


def may_change_doc(changes: Iterable[Change], base: Iterable[Changeable] = ()) -> list[Any]:
    """``mayChange`` entries opening ``changes`` (and what ``base`` opened), narrowest first: a
    subtree covers every change below it."""
    whole: set[FieldPath] = set()
    keyed: dict[FieldPath, set[str]] = {}
    for entry in base:
        if entry.keys:
            keyed.setdefault(entry.path, set()).update(entry.keys)
        else:
            whole.add(entry.path)
    for path, key in changes:
        if path in _CLOSED or key == "":
            continue
        if key is None:
            whole.add(path)
        else:
            keyed.setdefault(path, set()).add(key)

    def covered(path: FieldPath, *, strictly: bool) -> bool:
        return any(
            path[: len(other)] == other and (len(other) < len(path) or not strictly)
            for other in whole
        )

    entries: list[Any] = [
        {"path": ".".join(path)} for path in sorted(whole) if not covered(path, strictly=True)
    ]
    entries += [
        {"path": ".".join(path), "keys": _narrowest(keys)}
        for path, keys in sorted(keyed.items())
        if not covered(path, strictly=False)
    ]
    return entries


def _narrowest(keys: set[str]) -> list[str]:
    """The keys, without those a ``prefix/*`` pattern among them matches already."""
    patterns = [key[:-1] for key in keys if key.endswith("*")]
    return sorted(
        key
        for key in keys
        if key.endswith("*") or not any(key.startswith(prefix) for prefix in patterns)
    )
