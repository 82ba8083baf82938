"""Where the logged objects keep the driver, the node and the pool: the fields a proposed rule
names (NodeLocal paths, OnNode's node field, rule CEL's scope)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gatekeeper.audit.tools.generate._fields import leaf_paths
from gatekeeper.audit.tools.generate._observe import Observed, Owned
from gatekeeper.codec.jsonpath import MISSING, FieldPath, get_field, is_field_name
from gatekeeper.policy.model import POOL_SEPARATORS, STRICT_POOL_SEPARATORS
from gatekeeper.policy.ownership import pool_name_ok

__all__ = [
    "OnNodeField",
    "cel_scope",
    "node_local_paths",
    "on_node_field",
    "separators_seen",
]

_Match = Callable[[Any, str, str], bool]
_POD_NODE: FieldPath = ("spec", "nodeName")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def node_local_paths(objects: Owned) -> dict[str, str] | None:
    """Paths that hold the driver and node (and a node-prefixed pool) in every logged object."""
    if not objects:
        return None
    driver = _common_path(objects, lambda value, drv, node: value == drv)
    node = _common_path(objects, lambda value, drv, node: value == node)
    if driver is None or node is None:
        return None
    doc = {"driver": ".".join(driver), "node": ".".join(node)}
    pool = _common_path(
        objects,
        lambda value, drv, node: (
            isinstance(value, str) and value != node and pool_name_ok(value, node, POOL_SEPARATORS)
        ),
        prefer=("pool", "name"),
    )
    if pool is not None:
        doc["pool"] = ".".join(pool)
    return doc


def separators_seen(objects: Owned, pool: FieldPath) -> tuple[str, ...]:
    """The separators after the node name in the logged pool names ("/" always allowed)."""
    seen = set(STRICT_POOL_SEPARATORS)
    for obj, _, node in objects:
        value = get_field(obj, pool)
        if isinstance(value, str) and len(value) > len(node) and value.startswith(node):
            seen.add(value[len(node)])
    return tuple(sep for sep in POOL_SEPARATORS if sep in seen)


@dataclass(frozen=True, slots=True)
class OnNodeField:
    """Where objects of a kind name their node, and the field selector that pins it."""

    path: FieldPath
    selector: str


def on_node_field(requests: list[Observed], core_pods: bool) -> OnNodeField | None:
    """The node field of one version: the selector key its lists pinned to the node, a Pod's
    ``spec.nodeName``, else the field every object it read holds the node in."""
    pinned: Counter[str] = Counter(
        key
        for seen in requests
        if seen.info.verb in ("list", "watch")
        for key, value in seen.forwarded
        if value == seen.caller.node and _is_path(key)
    )
    if pinned:
        key = pinned.most_common(1)[0][0]
        return OnNodeField(tuple(key.split(".")), key)
    if core_pods:
        return OnNodeField(_POD_NODE, ".".join(_POD_NODE))
    read = [seen.node_fields for seen in requests if seen.info.verb == "get" and seen.node_fields]
    common = frozenset.intersection(*read) if read else frozenset()
    if not common:
        return None
    path = min(common, key=lambda p: (len(p), p))
    return OnNodeField(path, ".".join(path))


def cel_scope(objects: Owned) -> str | None:
    """A scope expression for objects that name the driver in one field and this node's pool (or
    the node) in another that no rule locates: both fields as every logged object held them."""
    if not objects:
        return None
    driver = _common_path(objects, lambda value, drv, node: value == drv)
    if driver is None:
        return None

    def pooled(value: Any, drv: str, node: str) -> bool:
        return isinstance(value, str) and pool_name_ok(value, node, POOL_SEPARATORS)

    candidates = [p for p in _matching(objects, pooled) if p != driver]
    if not candidates:
        return None
    pool = min(candidates, key=_pool_rank)
    exact = any(get_field(obj, pool) == node for obj, _, node in objects)
    separators = [sep for sep in separators_seen(objects, pool) if _prefixed(objects, pool, sep)]
    value = _access(pool)
    terms = [f"{value} == variables.node"] if exact else []
    terms += [f"{value}.startsWith(variables.node + '{sep}')" for sep in separators]
    either = terms[0] if len(terms) == 1 else f"({' || '.join(terms)})"
    return f"{_access(driver)} == variables.driver && {either}"


def _prefixed(objects: Owned, path: FieldPath, sep: str) -> bool:
    return any(
        isinstance(value := get_field(obj, path), str) and value.startswith(node + sep)
        for obj, _, node in objects
    )


def _pool_rank(path: FieldPath) -> tuple[int, int, int, FieldPath]:
    """A field named for a pool first, then one named for a node, outside metadata, shortest."""
    last = path[-1].lower()
    named = 0 if "pool" in last else 1 if "node" in last else 2
    return (named, int(path[0] == "metadata"), len(path), path)


def _access(path: FieldPath) -> str:
    """``object.?spec.?pool.orValue('')``: the field, or '' where any step is absent."""
    steps = "".join(f".?{step}" if _IDENTIFIER.match(step) else f"[?'{step}']" for step in path)
    return f"object{steps}.orValue('')"


def _is_path(key: str) -> bool:
    return all(is_field_name(step) for step in key.split("."))


def _common_path(objects: Owned, matches: _Match, prefer: FieldPath = ()) -> FieldPath | None:
    good = _matching(objects, matches)
    if not good:
        return None
    preferred = [p for p in good if prefer and p[-len(prefer) :] == prefer]
    return min(preferred or good, key=lambda p: (len(p), p))


def _matching(objects: Owned, matches: _Match) -> list[FieldPath]:
    """Paths (outside status) whose value ``matches`` in every object."""
    candidates = list(leaf_paths(objects[0][0]))
    return [
        path
        for path in candidates
        if all(
            (value := get_field(obj, path)) is not MISSING and matches(value, drv, node)
            for obj, drv, node in objects
        )
    ]
