"""CEL as text, for the admission-policy export: the comparison of two objects but for what
``mayChange`` allows."""

from __future__ import annotations

import json

from gatekeeper.codec.jsonpath import FieldPath
from gatekeeper.policy.changes import MAINTAINED
from gatekeeper.policy.model import Changeable

__all__ = ["unchanged_but"]

_MAINTAINED = tuple(path[1] for path in sorted(MAINTAINED))


def unchanged_but(allowed: tuple[Changeable, ...]) -> str:
    """CEL that holds when ``object`` is ``oldObject`` but for ``allowed`` (and the fields the
    apiserver maintains): the same comparison :func:`~gatekeeper.policy.changes.forbidden_change`
    makes."""
    return _compare("object", "oldObject", (), allowed)


def _compare(new: str, old: str, at: FieldPath, allowed: tuple[Changeable, ...]) -> str:
    exact = [entry for entry in allowed if entry.path == at]
    if exact:
        return _keys(new, old, exact[0]) if exact[0].keys else "true"
    below = {
        entry.path[len(at)]
        for entry in allowed
        if entry.path[: len(at)] == at and len(entry.path) > len(at)
    }
    skip = set(below) | ({*_MAINTAINED} if at == ("metadata",) else set())
    if not below and at:
        return f"{new} == {old}"
    listed = json.dumps(sorted(skip))
    parts = [
        f"{new}.all(k, k in {listed} || (k in {old} && {new}[k] == {old}[k]))",
        f"{old}.all(k, k in {listed} || k in {new})",
    ]
    for step in sorted(below):
        child_new, child_old = (
            f"{new}[?{json.dumps(step)}].orValue({{}})",
            f"{old}[?{json.dumps(step)}].orValue({{}})",
        )
        parts.append(f"({_compare(child_new, child_old, (*at, step), allowed)})")
    return " && ".join(parts)


def _keys(new: str, old: str, entry: Changeable) -> str:
    exact = [k for k in entry.keys if not k.endswith("*")]
    prefixes = [k[:-1] for k in entry.keys if k.endswith("*")]
    allowed = " || ".join(
        [f"k in {json.dumps(exact)}"] * bool(exact)
        + [f"k.startsWith({json.dumps(prefix)})" for prefix in prefixes]
    )
    return (
        f"{new}.all(k, {allowed} || (k in {old} && {new}[k] == {old}[k])) && "
        f"{old}.all(k, {allowed} || k in {new})"
    )
