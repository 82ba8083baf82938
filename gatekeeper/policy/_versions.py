"""One version of a policy kind, built from its entry once the schema has checked its shape:
field paths parsed, defaults filled in, and what a schema cannot say refused."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from gatekeeper.codec.jsonpath import FieldPath, parse_field_path
from gatekeeper.policy.draft import Located
from gatekeeper.policy.model import (
    STRICT_POOL_SEPARATORS,
    AllocationPaths,
    Changeable,
    Field,
    KindRule,
    VersionSpec,
)

__all__ = ["ALLOCATION_KEYS", "APISERVER_IMMUTABLE", "version_builder"]

APISERVER_IMMUTABLE = "apiserverImmutable"
ALLOCATION_KEYS = {
    "results": "results",
    "resultDriver": "result_driver",
    "nodeSelector": "node_selector",
    "devices": "devices",
    "deviceDriver": "device_driver",
}
"""AllocatedToDriver versions: policy key → AllocationPaths field (all required: no kind's field
names are compiled in as defaults)."""
# Paths a mayChange entry may not open: what names the object, and all of its metadata at once.
_UNCHANGEABLE = {
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "uid"),
}


def version_builder(
    rule: KindRule, separators: tuple[str, ...]
) -> Callable[[Located], VersionSpec]:
    """How one version entry of a kind under ``rule`` is built."""
    if rule is KindRule.ALLOCATED_TO_DRIVER:
        return _allocation_version
    if rule in (KindRule.OWN_NODE, KindRule.OWN_POD):
        return _own_object_version
    if rule is KindRule.ON_NODE:
        return _on_node_version
    if rule is KindRule.NODE_LOCAL:
        return partial(_node_local_version, separators=separators)
    return lambda _: VersionSpec(paths={}, selectors={})  # no paths: the rule needs none


def _path(loc: Located) -> FieldPath:
    try:
        return parse_field_path(loc.value)
    except ValueError as exc:  # the schema's pattern refuses it first: kept to fail closed
        loc.fail(str(exc))


def _paths(entry: Located, key: str) -> tuple[FieldPath, ...]:
    given = entry.get(key)
    return () if given is None else tuple(_path(given.at(i)) for i in range(len(given.value)))


def _own_object_version(entry: Located) -> VersionSpec:
    """OwnNode, OwnPod: ``mayChange``, what a write may change ([] or absent: read-only)."""
    changeable = []
    for index, item in enumerate(entry.value.get("mayChange", [])):
        path = _path(entry.at("mayChange", index, "path"))
        if path in _UNCHANGEABLE:
            entry.fail(f"{'.'.join(path)} cannot be opened to changes", "mayChange", index, "path")
        changeable.append(Changeable(path, tuple(item.get("keys", ()))))
    return VersionSpec(paths={}, selectors={}, may_change=tuple(changeable))


def _on_node_version(entry: Located) -> VersionSpec:
    """OnNode: where the object names its node, and the field selector that pins it."""
    node = _path(entry.at("node"))
    selector = entry.value.get("fieldSelectors", {}).get("node", ".".join(node))
    return VersionSpec(paths={Field.NODE: node}, selectors={Field.NODE: selector})


def _allocation_version(entry: Located) -> VersionSpec:
    paths = {attribute: _path(entry.at(key)) for key, attribute in ALLOCATION_KEYS.items()}
    opaque, times = _paths(entry, "opaque"), _paths(entry, "times")
    for index, time_path in enumerate(times):
        for under in opaque:
            if time_path[: len(under)] == under:
                entry.fail(
                    f"{'.'.join(time_path)} is under opaque path {'.'.join(under)}, which is "
                    "compared exactly",
                    "times",
                    index,
                )
    allocation = AllocationPaths(**paths, opaque=opaque, times=times)
    return VersionSpec(paths={}, selectors={}, allocation=allocation)


def _node_local_version(
    entry: Located, separators: tuple[str, ...] = STRICT_POOL_SEPARATORS
) -> VersionSpec:
    spec = entry.value
    paths = {fld: _path(entry.at(fld.value)) for fld in Field if fld.value in spec}
    given = spec.get("fieldSelectors", {})
    selectors = {
        fld: given.get(fld.value, ".".join(paths[fld])) for fld in (Field.DRIVER, Field.NODE)
    }
    # The pool is pinned on deletecollection only where a field selector can name it: every
    # kind selects on metadata.name; another path only if the policy names its selector.
    if "pool" in given:
        selectors[Field.POOL] = given["pool"]
    elif paths.get(Field.POOL) == ("metadata", "name"):
        selectors[Field.POOL] = "metadata.name"
    forbidden = _paths(entry, "forbidden")
    node_selector = None
    if "nodeSelector" in spec:
        node_selector = _path(entry.at("nodeSelector"))
        if node_selector in forbidden:
            entry.fail("is also listed under forbidden", "nodeSelector")
    immutable = frozenset(Field(value) for value in spec.get(APISERVER_IMMUTABLE, ()))
    if unlocated := sorted(fld.value for fld in immutable - set(paths)):
        entry.fail(f"names {', '.join(unlocated)}, which has no path here", APISERVER_IMMUTABLE)
    return VersionSpec(
        paths=paths,
        selectors=selectors,
        forbidden=forbidden,
        apiserver_immutable=immutable,
        pool_separators=separators,
        node_selector=node_selector,
    )
