"""What a write of an OwnNode or OwnPod object changes, against what its ``mayChange`` allows:
the first change outside it, named by path (and map key), or None."""

from __future__ import annotations

from typing import Any

from gatekeeper.codec.jsonpath import MISSING, FieldPath
from gatekeeper.policy.model import Changeable
from gatekeeper.rule import Rule, Violation

__all__ = ["MAINTAINED", "forbidden_change"]

MAINTAINED: frozenset[FieldPath] = frozenset(
    {("metadata", "resourceVersion"), ("metadata", "managedFields")}
)
"""Fields the apiserver sets on every write: a difference there is not the driver's change."""


def forbidden_change(old: Any, new: Any, allowed: tuple[Changeable, ...]) -> Violation | None:
    """Why ``new`` is not ``old`` with only ``allowed`` changes (None when it is)."""
    problem = _walk(old, new, (), allowed)
    return Violation(Rule.MAY_CHANGE, problem) if problem else None


def _walk(old: Any, new: Any, path: FieldPath, allowed: tuple[Changeable, ...]) -> str | None:
    if path in MAINTAINED:
        return None
    for entry in allowed:
        if entry.path == path:
            return _keys(old, new, entry, allowed) if entry.keys else None
    if _same(old, new):
        return None
    below = any(
        len(entry.path) > len(path) and entry.path[: len(path)] == path for entry in allowed
    )
    before, after = _as_map(old), _as_map(new)
    if (
        before is None
        or after is None
        or (not below and not (isinstance(old, dict) and isinstance(new, dict)))
    ):
        return f"{_dotted(path)} changes: {_only(allowed)}"
    # Both maps (or a map that appears or goes, with an allowed path below): key by key.
    for key in sorted(set(before) | set(after), key=str):
        problem = _walk(before.get(key, MISSING), after.get(key, MISSING), (*path, key), allowed)
        if problem:
            return problem
    return None


def _keys(old: Any, new: Any, entry: Changeable, allowed: tuple[Changeable, ...]) -> str | None:
    before, after = _as_map(old), _as_map(new)
    if before is None or after is None:
        return f"{_dotted(entry.path)} is not a map: {_only(allowed)}"
    for key in sorted(set(before) | set(after), key=str):
        if not _same(before.get(key, MISSING), after.get(key, MISSING)) and not entry.allows_key(
            str(key)
        ):
            return f"{_dotted(entry.path)}[{key}] changes: {_only(allowed)}"
    return None


def _same(old: Any, new: Any) -> bool:
    # null and absent are the same to the apiserver's storage of these fields.
    return (None if old is MISSING else old) == (None if new is MISSING else new)


def _as_map(value: Any) -> dict[str, Any] | None:
    if value is MISSING or value is None:
        return {}
    return value if isinstance(value, dict) else None


def _only(allowed: tuple[Changeable, ...]) -> str:
    shown = [
        f"{_dotted(entry.path)}[{', '.join(entry.keys)}]" if entry.keys else _dotted(entry.path)
        for entry in allowed
    ]
    return f"a write may change only {', '.join(shown)} (policy mayChange)"


def _dotted(path: FieldPath) -> str:
    return ".".join(str(step) for step in path) or "the object"
