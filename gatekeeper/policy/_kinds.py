"""One kind of a policy, built once its files have been composed and its shape checked by the
schema: what a schema cannot say (across a kind's keys and its versions, against the built-in
API groups) is refused here, naming the file and key of the value at fault."""

from __future__ import annotations

from dataclasses import replace

from gatekeeper.policy._expressions import read_kind_cel, read_version_cel
from gatekeeper.policy._versions import APISERVER_IMMUTABLE, version_builder
from gatekeeper.policy.draft import RawKind
from gatekeeper.policy.model import (
    BUILT_IN_GROUPS,
    STRICT_POOL_SEPARATORS,
    Field,
    KindRule,
    KindSpec,
    ListSelectorMode,
    Scope,
    VersionSpec,
)

__all__ = ["CONFIRMED", "build_kind"]

CONFIRMED = "apiserverImmutableConfirmed"


def build_kind(raw: RawKind) -> KindSpec:
    """The checked kind; a fault names the file and key of the value at fault."""
    keys = {name: loc.value for name, loc in raw.keys.items()}
    rule = KindRule(keys["rule"])
    verbs = frozenset(keys["verbs"])
    separators = tuple(keys.get("poolSeparators", STRICT_POOL_SEPARATORS))
    versions = _versions(raw, rule, separators)
    _check_versions(raw, rule, verbs, versions)
    return KindSpec(
        group=raw.group,
        resource=raw.resource,
        kind=keys["kind"],
        scope=Scope(keys["scope"]),
        rule=rule,
        versions=versions,
        verbs=verbs,
        subresources=frozenset(keys.get("subresources", ())),
        list_selector=ListSelectorMode(keys.get("listSelector", ListSelectorMode.REQUIRE.value)),
        fill=frozenset(Field(value) for value in keys.get("fill", ())),
        pool_separators=separators,
        encodings=_encodings(raw, rule),
        apiserver_immutable_confirmed=_check_apiserver_immutable(raw, versions),
        read_across_nodes=keys.get("readAcrossNodes", False),
    )


def _encodings(raw: RawKind, rule: KindRule) -> frozenset[str]:
    """``encodings``: request body encodings accepted. Protobuf and CBOR are decoded by the
    apiserver in a dry run (JSON is always read), so only kinds it serves built in can take
    protobuf: a custom resource endpoint cannot read it, and kube-apiserver 1.36.3 panics on a
    protobuf write of one (the connection is closed), a dry run included. The default is what
    client-go sends: ``[json, protobuf]`` for a built-in group (its typed clients write
    protobuf, with no fallback on a 415), ``[json]`` for any other."""
    given = raw.keys.get("encodings")
    if given is None:
        return frozenset({"json", "protobuf"} if raw.group in BUILT_IN_GROUPS else {"json"})
    encodings = frozenset(given.value)
    custom = raw.group not in BUILT_IN_GROUPS
    if "protobuf" in encodings and custom and rule is not KindRule.DRIVER_CREDENTIALS:
        # SECURITY: docs/policy.md "Request bodies" — the gatekeeper's own dry run of such a
        # body would crash the apiserver's request under the gatekeeper's credentials.
        given.fail(
            f"{raw.qualified} is a custom resource (its group is not one the apiserver serves "
            "built in), and a custom resource takes no protobuf bodies: its endpoint cannot "
            "decode them, and kube-apiserver 1.36.3 panics on a protobuf write of one (the "
            "gatekeeper's dry run would meet it under its own credentials); list json and cbor "
            "only"
        )
    return encodings


def _versions(raw: RawKind, rule: KindRule, separators: tuple[str, ...]) -> dict[str, VersionSpec]:
    """Each version's rules: the structural keys of its rule, then its CEL after the kind's."""
    build = version_builder(rule, separators)
    kind_cel = read_kind_cel(raw.keys, raw.qualified)
    sharing: dict[int, list[str]] = {}
    for name, entry in raw.versions.items():
        sharing.setdefault(id(entry), []).append(name)
    built: dict[int, VersionSpec] = {}
    versions: dict[str, VersionSpec] = {}
    for name, entry in raw.versions.items():
        # Names listed together share one entry: build (and report) it once.
        if id(entry) not in built:
            what = f"{raw.qualified} {', '.join(sharing[id(entry)])}"
            built[id(entry)] = replace(build(entry), cel=read_version_cel(entry, kind_cel, what))
        versions[name] = built[id(entry)]
    return versions


def _check_versions(
    raw: RawKind, rule: KindRule, verbs: frozenset[str], versions: dict[str, VersionSpec]
) -> None:
    """What a rule needs of every version: a way to change an own object, no deletecollection
    where each object would need its CEL."""
    for name, spec in versions.items():
        if "deletecollection" in verbs and spec.cel:
            raw.keys["verbs"].fail(
                f"deletecollection cannot be allowed on {raw.qualified} {name}: its CEL would "
                "have to hold for every object deleted, which the gatekeeper does not read"
            )
        writes = ", ".join(sorted(verbs & {"update", "patch"}))
        own = rule in (KindRule.OWN_NODE, KindRule.OWN_POD)
        if own and writes and not spec.may_change:
            raw.versions[name].fail(
                f"lists no mayChange, but verbs allow {writes}: name what a write may change "
                "(e.g. {path: metadata.labels, keys: [example.com/*]}), or drop update and patch",
                "mayChange",
            )


def _check_apiserver_immutable(raw: RawKind, versions: dict[str, VersionSpec]) -> bool:
    """``apiserverImmutable`` asserts what the apiserver refuses; on it the gatekeeper forwards
    an apply-create as an apply (DESIGN §4.4). For a built-in group that is Kubernetes' own
    compiled-in validation; for any other group it is whatever the cluster's CRD says, so the
    policy must confirm it for this kind by name: a kind block copied to a new kind does not
    carry the assertion over silently."""
    asserting = [name for name, spec in versions.items() if spec.apiserver_immutable]
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
            name = asserting[0]
            raw.versions[name].fail(
                f"asserts that the apiserver refuses changes to these fields of "
                f"{raw.qualified} {name}, a kind outside the built-in Kubernetes API groups: "
                f"only its CRD's validation (a rule self == oldSelf on each field) makes that "
                f"true. Confirm it with `{CONFIRMED}: {raw.qualified}` on the kind, or drop "
                f"{APISERVER_IMMUTABLE} (docs/policy.md#apiserverimmutable-a-security-assertion)",
                APISERVER_IMMUTABLE,
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
