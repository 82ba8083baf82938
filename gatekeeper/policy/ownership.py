"""Ownership checks for NodeLocal kinds: driver, node and node-prefixed pool (DESIGN §4.3)."""

from __future__ import annotations

import copy

from gatekeeper.jsonpath import MISSING, FieldPath, get_field, set_field
from gatekeeper.policy.model import Field, KindSpec, VersionSpec
from gatekeeper.types import KubeObject

__all__ = ["fill_missing", "ownership_violation", "pool_name_ok"]

_NAME: FieldPath = ("metadata", "name")


def pool_name_ok(pool: str, node: str) -> bool:
    """The pool is the node name, or the node name followed by ``-`` or ``/`` and more."""
    if pool == node:
        return True
    return any(pool.startswith(node + sep) and len(pool) > len(node) + 1 for sep in "-/")


def ownership_violation(
    version: VersionSpec, obj: KubeObject, driver: str, node: str, *, stored: bool = False
) -> str | None:
    """Why ``obj`` does not belong to ``driver`` on ``node``; None when it does.

    ``stored`` marks the object already in the API (the message says so).
    """
    whose = "the stored object's " if stored else ""
    driver_path = version.paths[Field.DRIVER]
    node_path = version.paths[Field.NODE]
    problem = _exact(obj, driver_path, driver, "the calling driver", whose) or _exact(
        obj, node_path, node, "this node", whose
    )
    if problem:
        return problem
    pool_path = version.paths.get(Field.POOL)
    if pool_path is not None and (problem := _pool(obj, pool_path, node, whose)):
        return problem
    if stored:
        return None
    for path in version.forbidden:
        value = get_field(obj, path)
        if value is not MISSING and value is not None and value is not False:
            return (
                f"{'.'.join(path)} is set: a node-local driver may only publish objects "
                f"for its own node ({'.'.join(node_path)})"
            )
    return None


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


def _pool(obj: KubeObject, path: FieldPath, node: str, whose: str) -> str | None:
    value = get_field(obj, path)
    dotted = ".".join(path)
    if (value is MISSING or value is None) and path == _NAME:
        generate = get_field(obj, ("metadata", "generateName"))
        if isinstance(generate, str) and generate.startswith(node + "-"):
            return None
        return f'metadata.generateName "{generate or ""}" must start with node name "{node}-"'
    if not isinstance(value, str) or not value:
        return f'{whose}{dotted} is empty: it must be prefixed by node name "{node}"'
    if not pool_name_ok(value, node):
        return f'{whose}{dotted} "{value}" is not prefixed by node name "{node}"'
    return None
