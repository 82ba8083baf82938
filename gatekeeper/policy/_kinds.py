"""One kind of a policy: read from a file's ``kinds`` or ``overrides``, merged, then checked.

A kind can be written by several files (an included file defines it, the including file
overrides some of its keys or versions); every value keeps the place it was written
(:class:`Located`), so each fault names the file and key that caused it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from gatekeeper.names import is_dns_subdomain
from gatekeeper.policy._context import Context, Located, join_key, parse_enum
from gatekeeper.policy._expressions import CEL_KEYS, KIND_CEL_KEYS, read_kind_cel, read_version_cel
from gatekeeper.policy._versions import APISERVER_IMMUTABLE, read_versions, version_parser
from gatekeeper.policy.model import (
    ALL_VERBS,
    BUILT_IN_GROUPS,
    ENCODINGS,
    POOL_SEPARATORS,
    RULE_VERBS,
    STRICT_POOL_SEPARATORS,
    Field,
    KindRule,
    KindSpec,
    ListSelectorMode,
    Scope,
    VersionSpec,
)

__all__ = [
    "CONFIRMED",
    "KIND_KEYS",
    "OVERRIDE_KEYS",
    "RawKind",
    "build_kind",
    "read_kind",
    "read_override",
]

_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_KIND = re.compile(r"^[A-Z][A-Za-z0-9]*$")
CONFIRMED = "apiserverImmutableConfirmed"
KIND_KEYS = {
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
    "readAcrossNodes",
    CONFIRMED,
    *KIND_CEL_KEYS,
}
_REQUIRED = ("group", "resource", "kind", "scope", "rule", "verbs", "versions")
# What a kind *is* cannot be overridden: an including file that wants another kind, scope or
# rule defines its own policy instead of reinterpreting someone else's.
OVERRIDE_KEYS = KIND_KEYS - {"kind", "scope"}
"""``rule`` in an override selects which entry of a kind listed under two rules it changes; it
never changes a rule."""
_NODE_LOCAL_ONLY = ("listSelector", "fill", "poolSeparators", "readAcrossNodes")
# The keys only some rules read, by rule (every other rule refuses them).
_RULE_KEYS = {KindRule.NODE_LOCAL: set(_NODE_LOCAL_ONLY), KindRule.ON_NODE: {"listSelector"}}
_VERB_ORDER = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


@dataclass(slots=True)
class RawKind:
    """A kind as written so far: its keys and versions, each where it was written."""

    group: str
    resource: str
    origin: Located
    """The ``kinds[i]`` entry that defined it."""
    keys: dict[str, Located]
    """Every kind-level key given, ``versions`` aside."""
    versions: dict[str, Located]
    """Version name → its rules (names listed together share one)."""

    @property
    def qualified(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def rule(self) -> str:
        """The rule as written ("" for an override that names none)."""
        loc = self.keys.get("rule")
        return loc.value if loc is not None and isinstance(loc.value, str) else ""

    @property
    def key(self) -> tuple[str, str, str]:
        """(group, resource, rule): a kind may be listed once per rule."""
        return (self.group, self.resource, self.rule)


def _identity(ctx: Context, key: str, kind: Any) -> tuple[str, str]:
    for required in ("group", "resource"):
        if required not in kind:
            ctx.fail(join_key(key, required), "is required")
    group = ctx.string(kind["group"], join_key(key, "group"))
    if group and not is_dns_subdomain(group):
        ctx.fail(join_key(key, "group"), f"{group!r} is not a DNS subdomain")
    resource = ctx.string(kind["resource"], join_key(key, "resource"), _RESOURCE)
    return group, resource


def _split(ctx: Context, key: str, kind: Any) -> tuple[dict[str, Located], dict[str, Located]]:
    keys = {
        name: Located(value, ctx, join_key(key, name))
        for name, value in kind.items()
        if name not in ("group", "resource", "versions")
    }
    versions = (
        read_versions(ctx, join_key(key, "versions"), kind["versions"])
        if "versions" in kind
        else {}
    )
    return keys, versions


def read_kind(ctx: Context, key: str, raw: Any) -> RawKind:
    """A complete kind of a file's ``kinds`` list."""
    kind = ctx.mapping(raw, key, KIND_KEYS)
    group, resource = _identity(ctx, key, kind)
    for required in _REQUIRED:
        if required not in kind:
            why = "is required"
            if required == "verbs":
                # No default: a default of every verb would allow deletecollection to a kind
                # an operator added without thinking about verbs (fail closed).
                why = (
                    "is required: the verbs drivers may use on this kind (e.g. [get, list, "
                    "watch]); no verbs are implied"
                )
            ctx.fail(join_key(key, required), why)
    keys, versions = _split(ctx, key, kind)
    return RawKind(group, resource, Located(kind, ctx, key), keys, versions)


def read_override(ctx: Context, key: str, raw: Any) -> RawKind:
    """An entry of a file's ``overrides``: the keys and versions to replace or add."""
    kind = ctx.mapping(raw, key, OVERRIDE_KEYS)
    group, resource = _identity(ctx, key, kind)
    keys, versions = _split(ctx, key, kind)
    if not keys and not versions:
        ctx.fail(key, "overrides nothing: give the keys or versions to replace")
    return RawKind(group, resource, Located(kind, ctx, key), keys, versions)


def build_kind(raw: RawKind) -> KindSpec:
    """The checked kind; a fault names the file and key of the value at fault."""
    rule = _enum(raw, "rule", KindRule, None)
    verbs = _verbs(raw.keys["verbs"])
    subresources = frozenset(_strings(raw, "subresources"))
    _check_rule(raw, rule, verbs, subresources)
    separators = _pool_separators(raw)
    versions = _versions(raw, rule, separators)
    _check_versions(raw, rule, verbs, versions)
    confirmed = _check_apiserver_immutable(raw, versions)
    kind = raw.keys["kind"]
    return KindSpec(
        group=raw.group,
        resource=raw.resource,
        kind=kind.ctx.string(kind.value, kind.key, _KIND),
        scope=_enum(raw, "scope", Scope, None),
        rule=rule,
        versions=versions,
        verbs=verbs,
        subresources=subresources,
        list_selector=_enum(raw, "listSelector", ListSelectorMode, ListSelectorMode.REQUIRE),
        fill=frozenset(_fill(raw)),
        pool_separators=separators,
        encodings=_encodings(raw),
        apiserver_immutable_confirmed=confirmed,
        read_across_nodes=_flag(raw, "readAcrossNodes"),
    )


def _enum(raw: RawKind, name: str, enum_type: Any, default: Any) -> Any:
    if name not in raw.keys:
        return default
    loc = raw.keys[name]
    return parse_enum(loc.ctx, enum_type, loc.value, loc.key)


def _strings(raw: RawKind, name: str) -> list[str]:
    if name not in raw.keys:
        return []
    loc = raw.keys[name]
    return loc.ctx.string_list(loc.value, loc.key)


def _flag(raw: RawKind, name: str) -> bool:
    loc = raw.keys.get(name)
    if loc is None:
        return False
    if not isinstance(loc.value, bool):
        loc.fail("must be true or false")
    return loc.value


def _fill(raw: RawKind) -> list[Field]:
    loc = raw.keys.get("fill")
    if loc is None:
        return []
    return [parse_enum(loc.ctx, Field, value, loc.key) for value in _strings(raw, "fill")]


def _allowed_verbs() -> list[str]:
    return [v for v in _VERB_ORDER if v in ALL_VERBS] + sorted(ALL_VERBS - set(_VERB_ORDER))


def _verbs(loc: Located) -> frozenset[str]:
    verbs = frozenset(loc.ctx.string_list(loc.value, loc.key))
    if unknown := verbs - ALL_VERBS:
        listed = ", ".join(f'"{verb}"' for verb in sorted(unknown))
        loc.fail(
            f"unknown verb{'s' if len(unknown) > 1 else ''} {listed} "
            f"(allowed: {', '.join(_allowed_verbs())})"
        )
    return verbs


def _pool_separators(raw: RawKind) -> tuple[str, ...]:
    """``poolSeparators``: what may follow the node name in a pool name (default ``["/"]``)."""
    if "poolSeparators" not in raw.keys:
        return STRICT_POOL_SEPARATORS
    loc = raw.keys["poolSeparators"]
    values = _strings(raw, "poolSeparators")
    if not values:
        loc.fail("must list at least one separator (the pool may always equal the node)")
    for value in values:
        if value not in POOL_SEPARATORS:
            loc.fail(f"{value!r} is not one of {', '.join(POOL_SEPARATORS)}")
    if len(set(values)) != len(values):
        loc.fail("lists a separator twice")
    return tuple(values)


def _encodings(raw: RawKind) -> frozenset[str]:
    """``encodings``: request body encodings accepted. Protobuf and CBOR are decoded by the
    apiserver in a dry run, so only kinds it serves built in can take them (a custom resource
    endpoint cannot read protobuf). The default is what client-go sends: ``[json, protobuf]``
    for a built-in group (its typed clients write protobuf, with no fallback on a 415), ``[json]``
    for any other."""
    if "encodings" not in raw.keys:
        built_in = raw.group in BUILT_IN_GROUPS
        return frozenset({"json", "protobuf"} if built_in else {"json"})
    loc = raw.keys["encodings"]
    values = _strings(raw, "encodings")
    for value in values:
        if value not in ENCODINGS:
            loc.fail(f"{value!r} is not one of {', '.join(ENCODINGS)}")
    if "json" not in values:
        loc.fail("must include json (patches and the gatekeeper's own reads are JSON)")
    if len(set(values)) != len(values):
        loc.fail("lists an encoding twice")
    return frozenset(values)


def _versions(raw: RawKind, rule: KindRule, separators: tuple[str, ...]) -> dict[str, VersionSpec]:
    """Each version's rules: the structural keys of its rule, then its CEL after the kind's."""
    parse_version = version_parser(rule, separators)
    kind_cel = read_kind_cel(raw.keys, raw.qualified)
    sharing: dict[int, list[str]] = {}
    for name, rules in raw.versions.items():
        sharing.setdefault(id(rules), []).append(name)
    parsed: dict[int, VersionSpec] = {}
    versions: dict[str, VersionSpec] = {}
    for name, rules in raw.versions.items():
        # Names listed together share one rule set: read (and report) it once.
        if id(rules) not in parsed:
            value = rules.value
            if isinstance(value, dict):
                value = {key: item for key, item in value.items() if key not in CEL_KEYS}
            spec = parse_version(rules.ctx, rules.key, value)
            what = f"{raw.qualified} {', '.join(sharing[id(rules)])}"
            cel = read_version_cel(rules, kind_cel, what, scope_required=rule is KindRule.CEL)
            parsed[id(rules)] = replace(spec, cel=cel)
        versions[name] = parsed[id(rules)]
    return versions


def _check_rule(
    raw: RawKind, rule: KindRule, verbs: frozenset[str], subresources: frozenset[str]
) -> None:
    """What each rule cannot mean: keys only other rules read, verbs it cannot decide."""
    for name in _NODE_LOCAL_ONLY:
        if name in raw.keys and name not in _RULE_KEYS.get(rule, set()):
            raw.keys[name].fail(f"is not used by rule {rule.value}")
    allowed = RULE_VERBS[rule]
    if extra := verbs - allowed:
        raw.keys["verbs"].fail(
            f"rule {rule.value} allows only {', '.join(sorted(allowed))}, not "
            f"{', '.join(sorted(extra))}"
        )
    if rule is KindRule.ALLOCATED_TO_DRIVER:
        _check_allocated(raw, verbs, subresources)
    elif rule in (KindRule.OWN_NODE, KindRule.OWN_POD):
        _check_own_object(raw, rule, subresources)
    elif rule is KindRule.DRIVER_NAMESPACE and raw.keys["scope"].value != Scope.NAMESPACED.value:
        raw.keys["scope"].fail("rule DriverNamespace is for namespaced kinds")
    elif rule is KindRule.DRIVER_CREDENTIALS:
        for name in KIND_CEL_KEYS & set(raw.keys):
            raw.keys[name].fail(
                "is not used by rule DriverCredentials: the apiserver decides with the driver's "
                "own RBAC"
            )


def _check_versions(
    raw: RawKind, rule: KindRule, verbs: frozenset[str], versions: dict[str, VersionSpec]
) -> None:
    """What a rule needs of every version: a way to change an own object, CEL only where the
    gatekeeper decides, no deletecollection where each object would need its CEL."""
    for name, spec in versions.items():
        rules = raw.versions[name]
        if rule is KindRule.DRIVER_CREDENTIALS and spec.cel:
            rules.fail("rule DriverCredentials takes no CEL: the apiserver decides")
        if "deletecollection" in verbs and spec.cel:
            raw.keys["verbs"].fail(
                f"deletecollection cannot be allowed on {raw.qualified} {name}: its CEL would "
                "have to hold for every object deleted, which the gatekeeper does not read"
            )
        writes = ", ".join(sorted(verbs & {"update", "patch"}))
        own = rule in (KindRule.OWN_NODE, KindRule.OWN_POD)
        if own and writes and not spec.may_change:
            rules.fail(
                f"lists no mayChange, but verbs allow {writes}: name what a write may change "
                "(e.g. {path: metadata.labels, keys: [example.com/*]}), or drop update and patch",
                "mayChange",
            )


def _check_allocated(raw: RawKind, verbs: frozenset[str], subresources: frozenset[str]) -> None:
    """What rule AllocatedToDriver cannot mean: creating or deleting objects allocated by
    someone else, or writing anything but their status."""
    if subresources - {"status"}:
        raw.keys["subresources"].fail("rule AllocatedToDriver allows only [status]")
    if verbs & {"update", "patch"} and "status" not in subresources:
        given = raw.keys.get("subresources")
        ctx, key = (
            (given.ctx, given.key)
            if given
            else (raw.origin.ctx, join_key(raw.origin.key, "subresources"))
        )
        ctx.fail(
            key,
            "rule AllocatedToDriver writes only through the status subresource: "
            "list [status] or drop update/patch from verbs",
        )


def _check_own_object(raw: RawKind, rule: KindRule, subresources: frozenset[str]) -> None:
    """Rule OwnNode names one cluster-scoped object, the one named after this node; OwnPod one
    namespaced object, the caller's pod."""
    if subresources:
        raw.keys["subresources"].fail(f"rule {rule.value} allows no subresources")
    scope = Scope.CLUSTER if rule is KindRule.OWN_NODE else Scope.NAMESPACED
    if raw.keys["scope"].value != scope.value:
        what = "a cluster-scoped" if scope is Scope.CLUSTER else "a namespaced"
        raw.keys["scope"].fail(f"rule {rule.value} names {what} object")


def _check_apiserver_immutable(raw: RawKind, versions: dict[str, VersionSpec]) -> bool:
    """``apiserverImmutable`` asserts what the apiserver refuses; on it the gatekeeper forwards
    an apply-create as an apply (DESIGN §4.4). For a built-in group that is Kubernetes' own
    compiled-in validation; for any other group it is whatever the cluster's CRD says, so the
    policy must confirm it for this kind by name: a kind block copied to a new kind does not
    carry the assertion over silently."""
    asserting = [
        (name, raw.versions[name]) for name, spec in versions.items() if spec.apiserver_immutable
    ]
    confirm = raw.keys.get(CONFIRMED)
    if raw.group in BUILT_IN_GROUPS:
        if confirm is not None:
            confirm.fail(
                f"is only for kinds outside the built-in Kubernetes API groups: the validation "
                f"of {raw.group or 'the core group'} is the apiserver's own"
            )
        return False
    if confirm is None:
        if asserting:
            name, rules = asserting[0]
            key = APISERVER_IMMUTABLE if APISERVER_IMMUTABLE in rules.value else "immutable"
            rules.fail(
                f"asserts that the apiserver refuses changes to these fields of "
                f"{raw.qualified} {name}, a kind outside the built-in Kubernetes API groups: "
                f"only its CRD's validation (a rule self == oldSelf on each field) makes that "
                f"true. Confirm it with `{CONFIRMED}: {raw.qualified}` on the kind, or drop "
                f"{key} (README, apiserverImmutable)",
                key,
            )
        return False
    if confirm.value != raw.qualified:
        confirm.fail(
            f"{confirm.value!r} is not this kind: it must name {raw.qualified} (a confirmation "
            "is for one kind's CRD, not for a copy of it)"
        )
    if not asserting:
        confirm.fail(f"confirms nothing: no version of {raw.qualified} lists {APISERVER_IMMUTABLE}")
    return True
