"""Load and validate a policy file; every problem names the file, the key and the rule."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Mapping
from functools import partial
from importlib import resources
from typing import Any

import yaml

from gatekeeper.codec.jsonpath import FieldPath
from gatekeeper.errors import ConfigError
from gatekeeper.names import is_dns_label, is_dns_subdomain, is_driver_name
from gatekeeper.policy._context import Context, join_key, parse_enum
from gatekeeper.policy.model import (
    ALL_VERBS,
    ALLOCATED_VERBS,
    ANY_DRIVER,
    ENCODINGS,
    OWN_NODE_VERBS,
    POOL_SEPARATORS,
    STRICT_POOL_SEPARATORS,
    AllocationPaths,
    Field,
    KindRule,
    KindSpec,
    ListSelectorMode,
    Policy,
    Scope,
    UnboundTokens,
    VersionSpec,
)

__all__ = ["ALLOCATION_KEYS", "DEFAULT_POLICY", "load_policy", "parse_policy"]

DEFAULT_POLICY = "<packaged default.yaml>"

_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_VERSION = re.compile(r"^v[1-9][0-9]*((alpha|beta)[1-9][0-9]*)?$")

_TOP_KEYS = {"apiVersion", "kind", "drivers", "kinds", "serviceAccounts", "unboundTokens"}
_SA_PREFIX = "system:serviceaccount:"
_KIND_KEYS = {
    "group",
    "resource",
    "kind",
    "scope",
    "rule",
    "versions",
    "verbs",
    "subresources",
    "listSelector",
    "fill",
    "poolSeparators",
    "encodings",
}
_VERSION_KEYS = {"driver", "node", "pool", "forbidden", "fieldSelectors", "immutable"}
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
_NODE_LOCAL_ONLY = ("listSelector", "fill", "poolSeparators")
_API_VERSION = "gatekeeper.dra.k8s.io/v1alpha1"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (YAML silently keeps the last)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_policy(path: str | None) -> Policy:
    """Load ``path`` (or the packaged default policy when None) and validate it."""
    if path is None:
        text = resources.files("gatekeeper").joinpath("policies/default.yaml").read_text()
        return parse_policy(text, DEFAULT_POLICY)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read policy: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: policy is not UTF-8 text") from exc
    return parse_policy(text, path)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Validate policy YAML ``text``; ConfigError naming ``source`` and the key on any fault."""
    stream = io.StringIO(text)
    stream.name = source  # PyYAML names the stream in its messages (else "<unicode string>")
    try:
        doc = yaml.load(stream, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {_one_line(exc)}") from exc
    ctx = Context(source)
    top = ctx.mapping(doc, "", _TOP_KEYS)
    if top.get("apiVersion", _API_VERSION) != _API_VERSION:
        ctx.fail("apiVersion", f"must be {_API_VERSION}")
    if top.get("kind", "Policy") != "Policy":
        ctx.fail("kind", "must be Policy")
    drivers = frozenset(_parse_drivers(ctx, top.get("drivers", [])))
    kinds: dict[tuple[str, str], KindSpec] = {}
    raw_kinds = top.get("kinds")
    if not isinstance(raw_kinds, list) or not raw_kinds:
        ctx.fail("kinds", "must be a non-empty list (an empty policy would allow nothing)")
    for index, raw in enumerate(raw_kinds):
        spec = _parse_kind(ctx, f"kinds[{index}]", raw)
        key = (spec.group, spec.resource)
        if key in kinds:
            ctx.fail(f"kinds[{index}]", f"{spec.qualified} is listed twice")
        kinds[key] = spec
    # The core group ("", e.g. an OwnNode kind) has no /apis/<group> discovery path to open.
    groups = frozenset(spec.group for spec in kinds.values() if spec.group)
    return Policy(
        kinds=kinds,
        drivers=drivers,
        source=source,
        groups=groups,
        service_accounts=_parse_service_accounts(ctx, top.get("serviceAccounts", {})),
        unbound_tokens=parse_enum(
            ctx, UnboundTokens, top.get("unboundTokens", "Refuse"), "unboundTokens"
        ),
    )


def _parse_service_accounts(ctx: Context, raw: Any) -> dict[str, str]:
    """``serviceAccounts``: driver → ``[namespace/name, …]``, as the user names a token's
    TokenReview gives (``system:serviceaccount:<namespace>:<name>``) → driver."""
    if not isinstance(raw, dict):
        ctx.fail("serviceAccounts", "must be a mapping of driver name to namespace/name list")
    mapped: dict[str, str] = {}
    for driver, accounts in raw.items():
        key = join_key("serviceAccounts", str(driver))
        if not isinstance(driver, str) or not is_driver_name(driver):
            ctx.fail(key, f"{driver!r} is not a DNS subdomain driver name")
        for index, account in enumerate(ctx.string_list(accounts, key)):
            namespace, _, name = account.partition("/")
            if not is_dns_label(namespace) or not is_dns_subdomain(name):
                ctx.fail(f"{key}[{index}]", f"{account!r} is not namespace/name")
            user = f"{_SA_PREFIX}{namespace}:{name}"
            if user in mapped:
                ctx.fail(
                    f"{key}[{index}]",
                    f"{account} is mapped to {mapped[user]} already: a service account "
                    "identifies one driver",
                )
            mapped[user] = driver
    return mapped


_VERB_ORDER = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def _allowed_verbs() -> list[str]:
    return [v for v in _VERB_ORDER if v in ALL_VERBS] + sorted(ALL_VERBS - set(_VERB_ORDER))


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _parse_drivers(ctx: Context, raw: Any) -> list[str]:
    names = ctx.string_list(raw, "drivers")
    for index, name in enumerate(names):
        if name != ANY_DRIVER and not is_driver_name(name):
            ctx.fail(f"drivers[{index}]", f"{name!r} is not a DNS subdomain driver name")
    return names


def _parse_kind(ctx: Context, key: str, raw: Any) -> KindSpec:
    kind = ctx.mapping(raw, key, _KIND_KEYS)
    for required in ("group", "resource", "kind", "scope", "rule", "versions"):
        if required not in kind:
            ctx.fail(join_key(key, required), "is required")
    group = ctx.string(kind["group"], join_key(key, "group"))
    if group and not is_dns_subdomain(group):
        ctx.fail(join_key(key, "group"), f"{group!r} is not a DNS subdomain")
    resource = ctx.string(kind["resource"], join_key(key, "resource"), _RESOURCE)
    rule = parse_enum(ctx, KindRule, kind["rule"], join_key(key, "rule"))
    allocated = rule is KindRule.ALLOCATED_TO_DRIVER
    own_node = rule is KindRule.OWN_NODE
    verbs_allowed = ALLOCATED_VERBS if allocated else OWN_NODE_VERBS if own_node else ALL_VERBS
    verbs = _parse_verbs(ctx, join_key(key, "verbs"), kind.get("verbs", sorted(verbs_allowed)))
    subresources = frozenset(
        ctx.string_list(kind.get("subresources", []), join_key(key, "subresources"))
    )
    if allocated:
        _check_allocated(ctx, key, kind, verbs, subresources)
    if own_node:
        _check_own_node(ctx, key, kind, verbs, subresources)
    versions_raw = kind["versions"]
    if not isinstance(versions_raw, dict) or not versions_raw:
        ctx.fail(join_key(key, "versions"), "must be a non-empty mapping of version to field paths")
    separators = _pool_separators(ctx, join_key(key, "poolSeparators"), kind)
    parse_version = _version_parser(rule, separators)
    versions = {
        ctx.string(name, join_key(key, f"versions.{name}"), _VERSION): parse_version(
            ctx, join_key(key, f"versions.{name}"), spec
        )
        for name, spec in versions_raw.items()
    }
    fill = frozenset(
        parse_enum(ctx, Field, v, join_key(key, "fill"))
        for v in ctx.string_list(kind.get("fill", []), join_key(key, "fill"))
    )
    return KindSpec(
        group=group,
        resource=resource,
        kind=ctx.string(kind["kind"], join_key(key, "kind"), _KIND),
        scope=parse_enum(ctx, Scope, kind["scope"], join_key(key, "scope")),
        rule=rule,
        versions=versions,
        verbs=verbs,
        subresources=subresources,
        list_selector=parse_enum(
            ctx,
            ListSelectorMode,
            kind.get("listSelector", "Require"),
            join_key(key, "listSelector"),
        ),
        fill=fill,
        pool_separators=separators,
        encodings=_encodings(ctx, join_key(key, "encodings"), kind),
    )


def _parse_verbs(ctx: Context, key: str, raw: Any) -> frozenset[str]:
    verbs = frozenset(ctx.string_list(raw, key))
    if unknown := verbs - ALL_VERBS:
        listed = ", ".join(f'"{verb}"' for verb in sorted(unknown))
        ctx.fail(
            key,
            f"unknown verb{'s' if len(unknown) > 1 else ''} {listed} "
            f"(allowed: {', '.join(_allowed_verbs())})",
        )
    return verbs


def _version_parser(
    rule: KindRule, separators: tuple[str, ...]
) -> Callable[[Context, str, Any], VersionSpec]:
    """How one version of a kind under ``rule`` is read."""
    if rule is KindRule.ALLOCATED_TO_DRIVER:
        return _parse_allocation_version
    if rule is KindRule.OWN_NODE:
        return _parse_own_node_version
    return partial(_parse_version, separators=separators)


def _pool_separators(ctx: Context, key: str, kind: Mapping[str, Any]) -> tuple[str, ...]:
    """``poolSeparators``: what may follow the node name in a pool name (default ``["/"]``)."""
    if "poolSeparators" not in kind:
        return STRICT_POOL_SEPARATORS
    raw = ctx.string_list(kind["poolSeparators"], key)
    if not raw:
        ctx.fail(key, "must list at least one separator (the pool may always equal the node)")
    for value in raw:
        if value not in POOL_SEPARATORS:
            ctx.fail(key, f"{value!r} is not one of {', '.join(POOL_SEPARATORS)}")
    if len(set(raw)) != len(raw):
        ctx.fail(key, "lists a separator twice")
    return tuple(raw)


def _encodings(ctx: Context, key: str, kind: Mapping[str, Any]) -> frozenset[str]:
    """``encodings``: request body encodings accepted (default ``[json]``). Protobuf and CBOR
    are decoded by the apiserver in a dry run: list them only for kinds it serves built in (a
    custom resource endpoint cannot read protobuf)."""
    raw = ctx.string_list(kind.get("encodings", ["json"]), key)
    for value in raw:
        if value not in ENCODINGS:
            ctx.fail(key, f"{value!r} is not one of {', '.join(ENCODINGS)}")
    if "json" not in raw:
        ctx.fail(key, "must include json (patches and the gatekeeper's own reads are JSON)")
    if len(set(raw)) != len(raw):
        ctx.fail(key, "lists an encoding twice")
    return frozenset(raw)


def _check_not_node_local(
    ctx: Context,
    key: str,
    kind: Mapping[str, Any],
    verbs: frozenset[str],
    rule: str,
    allowed: frozenset[str],
) -> None:
    """What a rule other than NodeLocal refuses: the keys only NodeLocal reads, and verbs
    beyond ``allowed``."""
    for name in _NODE_LOCAL_ONLY:
        if name in kind:
            ctx.fail(join_key(key, name), f"is not used by rule {rule}")
    if extra := verbs - allowed:
        ctx.fail(
            join_key(key, "verbs"),
            f"rule {rule} allows only {', '.join(sorted(allowed))}, not {', '.join(sorted(extra))}",
        )


def _check_allocated(
    ctx: Context,
    key: str,
    kind: Mapping[str, Any],
    verbs: frozenset[str],
    subresources: frozenset[str],
) -> None:
    """What rule AllocatedToDriver cannot mean: creating or deleting objects allocated by
    someone else, or writing anything but their status."""
    _check_not_node_local(ctx, key, kind, verbs, "AllocatedToDriver", ALLOCATED_VERBS)
    if subresources - {"status"}:
        ctx.fail(join_key(key, "subresources"), "rule AllocatedToDriver allows only [status]")
    if verbs & {"update", "patch"} and "status" not in subresources:
        ctx.fail(
            join_key(key, "subresources"),
            "rule AllocatedToDriver writes only through the status subresource: "
            "list [status] or drop update/patch from verbs",
        )


def _check_own_node(
    ctx: Context,
    key: str,
    kind: Mapping[str, Any],
    verbs: frozenset[str],
    subresources: frozenset[str],
) -> None:
    """Rule OwnNode reads one cluster-scoped object, the one named after this node."""
    _check_not_node_local(ctx, key, kind, verbs, "OwnNode", OWN_NODE_VERBS)
    if subresources:
        ctx.fail(join_key(key, "subresources"), "rule OwnNode allows no subresources")
    if kind.get("scope") != Scope.CLUSTER.value:
        ctx.fail(join_key(key, "scope"), "rule OwnNode names a cluster-scoped object")


def _parse_own_node_version(ctx: Context, key: str, raw: Any) -> VersionSpec:
    ctx.mapping({} if raw is None else raw, key, set())
    return VersionSpec(paths={}, selectors={})


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
    spec = ctx.mapping(raw, key, _VERSION_KEYS)
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
    immutable = frozenset(
        parse_enum(ctx, Field, name, f"{join_key(key, 'immutable')}[{i}]")
        for i, name in enumerate(
            ctx.string_list(spec.get("immutable", []), join_key(key, "immutable"))
        )
    )
    if unlocated := sorted(f.value for f in immutable - set(paths)):
        ctx.fail(
            join_key(key, "immutable"), f"names {', '.join(unlocated)}, which has no path here"
        )
    return VersionSpec(
        paths=paths,
        selectors=selectors,
        forbidden=forbidden,
        immutable=immutable,
        pool_separators=separators,
    )
