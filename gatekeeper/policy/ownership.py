"""Ownership checks for NodeLocal kinds: driver, node and node-prefixed pool (DESIGN §4.3).

A pool name is the node name, or the node name, one of the kind's ``poolSeparators`` (by
default only ``/``) and more: docs/policy.md#pool-names shows why ``<node>-<rest>`` is opt-in.
"""

from __future__ import annotations

import copy

from gatekeeper.codec.jsonpath import MISSING, FieldPath, get_field, set_field
from gatekeeper.codec.selectors import FieldRequirement
from gatekeeper.policy.model import STRICT_POOL_SEPARATORS, Field, KindSpec, VersionSpec
from gatekeeper.policy.nodeselector import names_only
from gatekeeper.rule import Rule, Violation
from gatekeeper.types import KubeObject

__all__ = [
    "collection_pool_violation",
    "driver_violation",
    "fill_missing",
    "ownership_violation",
    "pool_name_ok",
]

_NAME: FieldPath = ("metadata", "name")


def pool_name_ok(
    pool: str, node: str, separators: tuple[str, ...] = STRICT_POOL_SEPARATORS
) -> bool:
    """The pool is the node name, or the node name followed by a separator and more."""
    if pool == node:
        return True
    return any(pool.startswith(node + sep) and len(pool) > len(node) + 1 for sep in separators)


def collection_pool_violation(
    version: VersionSpec, terms: tuple[FieldRequirement, ...], node: str
) -> Violation | None:
    """Why a deletecollection's field selector does not pin the pool to one the rule accepts;
    None when it does, or when no field selector can name this version's pool.

    SECURITY: DESIGN §4.3 — get and delete refuse a stored object whose pool breaks the rule,
    so deletecollection must not reach it either. Where the pool cannot be selected on (the
    ResourceSlice ``spec.pool.name``), docs/policy.md#pool-names says what remains.
    """
    key = version.selectors.get(Field.POOL)
    if key is None:
        return None
    pinned = [t.value for t in terms if t.field == key and t.operator == "="]
    if not pinned:
        return Violation(
            Rule.SELECTOR_REQUIRED,
            f'deletecollection requires fieldSelector {key}=<pool>: node name "{node}", or '
            f"prefixed by it followed by {_shown(version)}",
        )
    for value in pinned:
        if not pool_name_ok(value, node, version.pool_separators):
            why = _not_prefixed(value, node, version)
            return Violation(Rule.POOL_PREFIX, f'fieldSelector pins {key}="{value}", which {why}')
    return None


def _shown(version: VersionSpec) -> str:
    return " or ".join(f'"{sep}"' for sep in version.pool_separators)


def _not_prefixed(value: str, node: str, version: VersionSpec) -> str:
    said = f'is not prefixed by node name "{node}"'
    return f"{said} followed by {_shown(version)}" if value.startswith(node) else said


def ownership_violation(
    version: VersionSpec, obj: KubeObject, driver: str, node: str, *, stored: bool = False
) -> Violation | None:
    """Why ``obj`` does not belong to ``driver`` on ``node``; None when it does.

    ``stored`` marks the object already in the API (the message says so).
    """
    whose = "the stored object's " if stored else ""
    driver_path = version.paths[Field.DRIVER]
    node_path = version.paths[Field.NODE]
    problem = _exact(obj, driver_path, driver, "the calling driver", whose)
    if problem:
        return Violation(Rule.DRIVER_MISMATCH, problem)
    if problem := _node(version, obj, node, whose):
        return Violation(Rule.NODE_MISMATCH, problem)
    pool_path = version.paths.get(Field.POOL)
    if pool_path is not None and (problem := _pool(version, obj, pool_path, node, whose)):
        return Violation(Rule.POOL_PREFIX, problem)
    if stored:
        return None
    for path in version.forbidden:
        value = get_field(obj, path)
        if value is not MISSING and value is not None and value is not False:
            return Violation(
                Rule.FORBIDDEN_FIELD,
                f"{'.'.join(path)} is set: a node-local driver may only publish objects "
                f"for its own node ({'.'.join(node_path)})",
            )
    return None


def _node(version: VersionSpec, obj: KubeObject, node: str, whose: str) -> str | None:
    """The object is this node's: its node field names it, or (where the version has a
    ``nodeSelector`` path and the node field is empty) its node selector names this node and
    no other, and any owner reference to a Node is to this one."""
    node_path, selector_path = version.paths[Field.NODE], version.node_selector
    value = get_field(obj, node_path)
    if selector_path is None or value not in (MISSING, None, ""):
        return _exact(obj, node_path, node, "this node", whose)
    selector = get_field(obj, selector_path)
    dotted = ".".join(selector_path)
    if selector is MISSING or selector is None:
        return _exact(obj, node_path, node, "this node", whose)
    if not names_only(selector, node):
        return (
            f"{whose}{dotted} must name this node and no other (one term: matchFields "
            f'metadata.name In ["{node}"])'
        )
    for owner in get_field(obj, ("metadata", "ownerReferences")) or []:
        if isinstance(owner, dict) and owner.get("kind") == "Node" and owner.get("name") != node:
            return (
                f'{whose}metadata.ownerReferences names Node "{owner.get("name")}", not this node'
            )
    return None


def driver_violation(version: VersionSpec, obj: KubeObject, driver: str) -> Violation | None:
    """Why the stored ``obj`` is not ``driver``'s (on any node); None when it is."""
    path = version.paths[Field.DRIVER]
    problem = _exact(obj, path, driver, "the calling driver", "the stored object's ")
    return Violation(Rule.DRIVER_MISMATCH, problem) if problem else None


def fill_missing(
    kind: KindSpec, version: VersionSpec, obj: KubeObject, driver: str, node: str
) -> KubeObject:
    """A copy of ``obj`` with the kind's ``fill`` fields set where empty (pool = node name)."""
    wanted = {Field.DRIVER: driver, Field.NODE: node, Field.POOL: node}
    filled = obj
    for fld in sorted(kind.fill, key=lambda f: f.value):
        path = version.paths.get(fld)
        if path is None or get_field(obj, path) not in (MISSING, None, ""):
            continue
        if fld is Field.POOL and path == _NAME and get_field(obj, ("metadata", "generateName")):
            continue
        if filled is obj:
            filled = copy.deepcopy(obj)
        set_field(filled, path, wanted[fld])
    return filled


def _exact(obj: KubeObject, path: FieldPath, want: str, what: str, whose: str) -> str | None:
    value = get_field(obj, path)
    dotted = ".".join(path)
    if value is MISSING or value is None or value == "":
        return f"{whose}{dotted} is empty: it must be {what} {want!r}".replace("'", '"')
    if value != want:
        shown = value if isinstance(value, str) else repr(value)
        return f'{whose}{dotted} "{shown}" does not match {what} "{want}"'
    return None


def _pool(
    version: VersionSpec, obj: KubeObject, path: FieldPath, node: str, whose: str
) -> str | None:
    value = get_field(obj, path)
    dotted = ".".join(path)
    if (value is MISSING or value is None) and path == _NAME:
        generate = get_field(obj, ("metadata", "generateName"))
        starts = [node + sep for sep in version.pool_separators]
        if isinstance(generate, str) and any(generate.startswith(start) for start in starts):
            return None
        return (
            f'metadata.generateName "{generate or ""}" must start with node name "{node}" '
            f"followed by {_shown(version)}"
        )
    if not isinstance(value, str) or not value:
        return f'{whose}{dotted} is empty: it must be prefixed by node name "{node}"'
    if not pool_name_ok(value, node, version.pool_separators):
        return f'{whose}{dotted} "{value}" {_not_prefixed(value, node, version)}'
    return None
