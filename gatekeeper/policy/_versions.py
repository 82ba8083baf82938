"""The versions of a policy kind: which names share which rules, and each rule set read.

A file in the current format lists versions that share rules together
(``versions: [{names: [v1beta2, v1], driver: …}]``); a file in the deprecated format maps each
version to its rules (``versions: {v1: {…}}``, shared through YAML anchors) and calls
``apiserverImmutable`` ``immutable``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from gatekeeper.codec.jsonpath import FieldPath
from gatekeeper.policy._context import Context, Located, join_key, parse_enum
from gatekeeper.policy.model import (
    STRICT_POOL_SEPARATORS,
    AllocationPaths,
    Changeable,
    Field,
    KindRule,
    VersionSpec,
)

__all__ = [
    "ALLOCATION_KEYS",
    "APISERVER_IMMUTABLE",
    "LEGACY_IMMUTABLE",
    "VERSION_KEYS",
    "read_versions",
    "version_parser",
]

_VERSION_NAME = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")
APISERVER_IMMUTABLE = "apiserverImmutable"
LEGACY_IMMUTABLE = "immutable"
"""The deprecated name of ``apiserverImmutable``, read in deprecated-format files only."""
VERSION_KEYS = {
    "driver",
    "node",
    "pool",
    "forbidden",
    "fieldSelectors",
    APISERVER_IMMUTABLE,
    "nodeSelector",
}
"""The keys of a NodeLocal version (besides ``names``)."""
# AllocatedToDriver versions: policy key -> AllocationPaths field (all required: no kind's
# field names are compiled in as defaults).
ALLOCATION_KEYS = {
    "results": "results",
    "resultDriver": "result_driver",
    "nodeSelector": "node_selector",
    "devices": "devices",
    "deviceDriver": "device_driver",
}
# Optional AllocatedToDriver version keys: paths (list steps implicit) of opaque JSON, and of
# the fields the apiserver stores as times.
_ALLOCATION_OPAQUE = "opaque"
_ALLOCATION_TIMES = "times"


def read_versions(ctx: Context, key: str, raw: Any) -> dict[str, Located]:
    """Version name → its rules where they are written; a name given twice is refused."""
    if ctx.legacy:
        if not isinstance(raw, dict) or not raw:
            ctx.fail(key, "must be a non-empty mapping of version to field paths")
        mapped: dict[str, Located] = {}
        for name, spec in raw.items():
            where = join_key(key, ctx.string(name, join_key(key, str(name)), _VERSION_NAME))
            if isinstance(spec, dict) and LEGACY_IMMUTABLE in spec:
                ctx.legacy_immutable.append(where)
            mapped[name] = Located(spec, ctx, where)
        return mapped
    if not isinstance(raw, list) or not raw:
        ctx.fail(
            key,
            "must be a non-empty list of {names: [<version>, …], <rules>} (versions that share "
            "rules are listed together)",
        )
    versions: dict[str, Located] = {}
    for index, entry in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(entry, dict):
            ctx.fail(where, "must be a mapping with names and the rules they share")
        if "names" not in entry:
            ctx.fail(join_key(where, "names"), "is required (the versions these rules are for)")
        names = ctx.string_list(entry["names"], join_key(where, "names"))
        if not names:
            ctx.fail(join_key(where, "names"), "must name at least one version")
        rules = Located({k: v for k, v in entry.items() if k != "names"}, ctx, where)
        for position, name in enumerate(names):
            name_key = f"{join_key(where, 'names')}[{position}]"
            ctx.string(name, name_key, _VERSION_NAME)
            if name in versions:
                ctx.fail(name_key, f"{name} is named twice (also at {versions[name].key})")
            versions[name] = rules
    return versions


def version_parser(
    rule: KindRule, separators: tuple[str, ...]
) -> Callable[[Context, str, Any], VersionSpec]:
    """How one version of a kind under ``rule`` is read."""
    if rule is KindRule.ALLOCATED_TO_DRIVER:
        return _parse_allocation_version
    if rule in (KindRule.OWN_NODE, KindRule.OWN_POD):
        return _parse_own_object_version
    if rule is KindRule.ON_NODE:
        return _parse_on_node_version
    if rule is KindRule.NODE_LOCAL:
        return partial(_parse_version, separators=separators)
    return _parse_empty_version


def _parse_empty_version(ctx: Context, key: str, raw: Any) -> VersionSpec:
    """A version whose rule needs no paths (DriverNamespace, CEL, DriverCredentials)."""
    ctx.mapping({} if raw is None else raw, key, set())
    return VersionSpec(paths={}, selectors={})


# Paths a mayChange entry may not open: what names the object, and all of its metadata at once.
_UNCHANGEABLE = {
    ("metadata",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "uid"),
}


def _parse_own_object_version(ctx: Context, key: str, raw: Any) -> VersionSpec:
    """OwnNode, OwnPod: ``mayChange``, what a write may change ([] or absent: read-only)."""
    spec = ctx.mapping({} if raw is None else raw, key, {"mayChange"})
    where = join_key(key, "mayChange")
    entries = spec.get("mayChange", [])
    if not isinstance(entries, list):
        ctx.fail(where, "must be a list of {path, keys}")
    changeable = []
    for index, entry in enumerate(entries):
        at = f"{where}[{index}]"
        item = ctx.mapping(entry, at, {"path", "keys"})
        if "path" not in item:
            ctx.fail(join_key(at, "path"), "is required (the JSON path that may change)")
        path = ctx.path(item["path"], join_key(at, "path"))
        if path in _UNCHANGEABLE:
            ctx.fail(join_key(at, "path"), f"{'.'.join(path)} cannot be opened to changes")
        keys = tuple(ctx.string_list(item.get("keys", []), join_key(at, "keys")))
        for position, pattern in enumerate(keys):
            if not pattern or "*" in pattern[:-1]:
                ctx.fail(
                    f"{join_key(at, 'keys')}[{position}]",
                    f"{pattern!r}: a key, or a prefix ending in * (only at the end)",
                )
        if "keys" in item and not keys:
            ctx.fail(join_key(at, "keys"), "must list at least one key (or leave keys out)")
        changeable.append(Changeable(path, keys))
    return VersionSpec(paths={}, selectors={}, may_change=tuple(changeable))


def _parse_on_node_version(ctx: Context, key: str, raw: Any) -> VersionSpec:
    """OnNode: where the object names its node, and the field selector that pins it."""
    spec = ctx.mapping(raw, key, {"node", "fieldSelectors"})
    if "node" not in spec:
        ctx.fail(join_key(key, "node"), "is required (the JSON path of the object's node)")
    node = ctx.path(spec["node"], join_key(key, "node"))
    selectors = ctx.mapping(
        spec.get("fieldSelectors", {}), join_key(key, "fieldSelectors"), {"node"}
    )
    selector = ctx.string(
        selectors.get("node", ".".join(node)), join_key(key, "fieldSelectors.node")
    )
    return VersionSpec(paths={Field.NODE: node}, selectors={Field.NODE: selector})


def _parse_allocation_version(ctx: Context, key: str, raw: Any) -> VersionSpec:
    spec = ctx.mapping(raw, key, {*ALLOCATION_KEYS, _ALLOCATION_OPAQUE, _ALLOCATION_TIMES})
    paths: dict[str, FieldPath] = {}
    for name, attribute in ALLOCATION_KEYS.items():
        if name not in spec:
            ctx.fail(join_key(key, name), "is required (a JSON path) by rule AllocatedToDriver")
        paths[attribute] = ctx.path(spec[name], join_key(key, name))
    opaque = _path_list(ctx, key, spec, _ALLOCATION_OPAQUE)
    times = _path_list(ctx, key, spec, _ALLOCATION_TIMES)
    for i, time_path in enumerate(times):
        for under in opaque:
            if time_path[: len(under)] == under:
                ctx.fail(
                    f"{join_key(key, _ALLOCATION_TIMES)}[{i}]",
                    f"{'.'.join(time_path)} is under opaque path {'.'.join(under)}, which is "
                    "compared exactly",
                )
    allocation = AllocationPaths(**paths, opaque=opaque, times=times)
    return VersionSpec(paths={}, selectors={}, allocation=allocation)


def _path_list(ctx: Context, key: str, spec: Mapping[str, Any], name: str) -> tuple[FieldPath, ...]:
    where = join_key(key, name)
    listed = ctx.string_list(spec.get(name, []), where)
    return tuple(ctx.path(p, f"{where}[{i}]") for i, p in enumerate(listed))


def _parse_version(
    ctx: Context, key: str, raw: Any, separators: tuple[str, ...] = STRICT_POOL_SEPARATORS
) -> VersionSpec:
    allowed = VERSION_KEYS | ({LEGACY_IMMUTABLE} if ctx.legacy else set())
    spec = ctx.mapping(raw, key, allowed)
    paths: dict[Field, FieldPath] = {}
    for fld in Field:
        if fld.value in spec:
            paths[fld] = ctx.path(spec[fld.value], join_key(key, fld.value))
        elif fld is not Field.POOL:
            ctx.fail(join_key(key, fld.value), "is required (the JSON path of the field)")
    selectors_raw = ctx.mapping(
        spec.get("fieldSelectors", {}), join_key(key, "fieldSelectors"), {"driver", "node", "pool"}
    )
    selectors = {
        fld: ctx.string(
            selectors_raw.get(fld.value, ".".join(paths[fld])),
            join_key(key, f"fieldSelectors.{fld.value}"),
        )
        for fld in (Field.DRIVER, Field.NODE)
    }
    # The pool is pinned on deletecollection only where a field selector can name it: every
    # kind selects on metadata.name; another path only if the policy names its selector.
    pool_path = paths.get(Field.POOL)
    if "pool" in selectors_raw:
        if pool_path is None:
            ctx.fail(join_key(key, "fieldSelectors.pool"), "needs a pool path")
        selectors[Field.POOL] = ctx.string(
            selectors_raw["pool"], join_key(key, "fieldSelectors.pool")
        )
    elif pool_path == ("metadata", "name"):
        selectors[Field.POOL] = "metadata.name"
    forbidden = tuple(
        ctx.path(p, f"{join_key(key, 'forbidden')}[{i}]")
        for i, p in enumerate(
            ctx.string_list(spec.get("forbidden", []), join_key(key, "forbidden"))
        )
    )
    node_selector = None
    if "nodeSelector" in spec:
        node_selector = ctx.path(spec["nodeSelector"], join_key(key, "nodeSelector"))
        if node_selector in forbidden:
            ctx.fail(join_key(key, "nodeSelector"), "is also listed under forbidden")
    return VersionSpec(
        paths=paths,
        selectors=selectors,
        forbidden=forbidden,
        apiserver_immutable=_apiserver_immutable(ctx, key, spec, paths),
        pool_separators=separators,
        node_selector=node_selector,
    )


def _apiserver_immutable(
    ctx: Context, key: str, spec: Mapping[str, Any], paths: Mapping[Field, FieldPath]
) -> frozenset[Field]:
    """``apiserverImmutable`` (``immutable`` in a deprecated-format file): the ownership fields
    the apiserver itself refuses to change. Whether the kind may assert it is the kind's check."""
    name = APISERVER_IMMUTABLE
    if LEGACY_IMMUTABLE in spec:
        if APISERVER_IMMUTABLE in spec:
            ctx.fail(
                join_key(key, LEGACY_IMMUTABLE),
                f"is the deprecated name of {APISERVER_IMMUTABLE}: give one of them",
            )
        name = LEGACY_IMMUTABLE
    where = join_key(key, name)
    fields = frozenset(
        parse_enum(ctx, Field, value, f"{where}[{i}]")
        for i, value in enumerate(ctx.string_list(spec.get(name, []), where))
    )
    if unlocated := sorted(f.value for f in fields - set(paths)):
        ctx.fail(where, f"names {', '.join(unlocated)}, which has no path here")
    return fields
