"""One proposed policy entry: a resource under one rule, with the verbs, versions and keys its
logged requests need; what a reviewer must check goes to the header's notes."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.audit.tools.generate._base import version_doc
from gatekeeper.audit.tools.generate._changes import Change, may_change_doc
from gatekeeper.audit.tools.generate._observe import Observed, Traffic
from gatekeeper.audit.tools.generate._paths import separators_seen
from gatekeeper.audit.tools.generate._rules import Facts
from gatekeeper.policy import KindRule, KindSpec, ListSelectorMode, Scope
from gatekeeper.policy.model import BUILT_IN_GROUPS, ENCODINGS, STRICT_POOL_SEPARATORS

__all__ = ["Notes", "entry_doc", "note_lines"]

_OWN = (KindRule.OWN_NODE, KindRule.OWN_POD)
_WRITES = frozenset({"update", "patch"})
_COLLECTION_VERBS = frozenset({"list", "watch", "deletecollection"})
_MISSING = {
    KindRule.NODE_LOCAL: "no field of the logged objects holds the driver and node names",
    KindRule.ON_NODE: "no field of the logged objects or selectors holds the node",
    KindRule.CEL: "no field of the logged objects holds the driver and a pool of the node",
    KindRule.ALLOCATED_TO_DRIVER: "the base policy has no allocation paths for this version",
}


@dataclass(slots=True)
class Notes:
    """The header: what is not allowed, and what a reviewer must check."""

    not_allowed: list[str] = field(default_factory=list)
    review: list[str] = field(default_factory=list)
    credentials: list[str] = field(default_factory=list)
    """Entries forwarded under the driver's own token (one note names them all)."""


def note_lines(label: str, note: str) -> list[str]:
    """``note`` as header comment lines of a generated file: ``# <label>: …`` folded at 100
    columns, never inside a word or a path."""
    return textwrap.wrap(
        note,
        width=100,
        initial_indent=f"# {label}: ",
        subsequent_indent="#   ",
        break_long_words=False,
        break_on_hyphens=False,
    )


@dataclass(frozen=True, slots=True)
class _Entry:
    traffic: Traffic
    rule: KindRule
    requests: list[Observed]
    base: KindSpec | None
    """The base policy's entry of this resource under this rule."""
    facts: Facts

    @property
    def what(self) -> str:
        return f"{self.traffic.qualified} (rule {self.rule.value})"


def entry_doc(
    traffic: Traffic,
    rule: KindRule,
    requests: list[Observed],
    base: KindSpec | None,
    facts: Facts,
    notes: Notes,
) -> dict[str, Any] | None:
    """The entry for ``requests`` under ``rule`` (None when no version of it can be written)."""
    entry = _Entry(traffic, rule, requests, base, facts)
    versions = _versions(entry, notes)
    if not versions:
        return None
    verbs = sorted({seen.info.verb for seen in requests if seen.info.api_version in versions})
    if rule in _OWN and _WRITES & set(verbs):
        may_change = _may_change(entry, notes)
        for version in versions.values():
            version["mayChange"] = may_change
    doc: dict[str, Any] = {
        "group": traffic.group,
        "resource": traffic.resource,
        "kind": traffic.kind,
        "scope": _scope(traffic).value,
        "rule": rule.value,
        "verbs": verbs,
    }
    doc.update(_kind_keys(entry, versions, notes))
    doc["versions"] = _version_list(versions)
    if rule is KindRule.DRIVER_CREDENTIALS:
        notes.credentials.append(f"{traffic.qualified} [{', '.join(verbs)}]")
        if all(seen.record.level == "Metadata" for seen in traffic.requests):
            notes.review.append(
                f"{entry.what}: the log (Metadata level) holds no object of it, in which a "
                "narrower rule could find the driver and node: record at --audit-level Request "
                "or RequestResponse to see whether one fits"
            )
    return doc


def _scope(traffic: Traffic) -> Scope:
    return Scope.NAMESPACED if traffic.namespaced else Scope.CLUSTER


def _versions(entry: _Entry, notes: Notes) -> dict[str, dict[str, Any]]:
    """Each version's rules: the base's where it has the version, else what the log shows."""
    docs: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    for version in sorted({seen.info.api_version for seen in entry.requests}):
        spec = entry.base.versions.get(version) if entry.base else None
        doc = version_doc(spec, entry.rule) if spec else _inferred(entry, version, notes)
        if doc is None:
            missing.append(version)
        else:
            docs[version] = doc
    if missing:
        count = sum(seen.count for seen in entry.requests if seen.info.api_version in missing)
        notes.not_allowed.append(
            f"{entry.traffic.qualified} {', '.join(missing)} ({count} requests seen): "
            f"{_MISSING.get(entry.rule, 'not in the base policy')}"
        )
    return docs


def _inferred(entry: _Entry, version: str, notes: Notes) -> dict[str, Any] | None:
    """A version the base does not have, as the log shows it (a reviewer's note where the log
    can only suggest it)."""
    facts, rule = entry.facts, entry.rule
    what = f"{entry.traffic.qualified} {version} (rule {rule.value})"
    if rule is KindRule.NODE_LOCAL:
        paths = facts.node_local(version)
        return dict(paths) if paths else None
    if rule is KindRule.ON_NODE:
        found = facts.on_node(version)
        if found is None:
            return None
        path = ".".join(found.path)
        assumed = sum(
            seen.count
            for seen in entry.requests
            if seen.info.api_version == version
            and seen.info.verb == "get"
            and seen.node_fields is None
        )
        if assumed:
            notes.review.append(f"{what}: {assumed} get requests {_ASSUMED_ON_NODE}")
        if found.selector == path:
            return {"node": path}
        return {"node": path, "fieldSelectors": {"node": found.selector}}
    if rule is KindRule.CEL:
        scope = facts.scope(version)
        if scope is None:
            return None
        objects = len(entry.traffic.objects(version))
        notes.review.append(f"{what}: {_SCOPE.format(objects=objects)}")
        return {"scope": scope}
    if rule is KindRule.ALLOCATED_TO_DRIVER:
        return None
    return {}  # own objects (mayChange follows), a namespace, the driver's own credentials


_ASSUMED_ON_NODE = (
    "assumed to read objects on this node: the log does not hold what they read (record at "
    "--audit-level RequestResponse to check)"
)
_SCOPE = (
    "scope proposed from the fields that held the driver and this node's pool in every logged "
    "object ({objects}): review it before use (an object in scope may be written)"
)


def _may_change(entry: _Entry, notes: Notes) -> list[Any]:
    """What the logged writes changed, and what the base let change; a placeholder, said so,
    when the log shows none of it."""
    changes: set[Change] = set()
    unknown: list[Observed] = []
    for seen in entry.requests:
        if seen.info.verb in _WRITES:
            if seen.changes is None:
                unknown.append(seen)
            else:
                changes |= seen.changes
    base = [
        item
        for spec in (entry.base.versions.values() if entry.base else ())
        for item in spec.may_change
    ]
    entries = may_change_doc(changes, base)
    if not entries:
        drivers = sorted({seen.caller.driver for seen in entry.requests})
        entries = [{"path": "metadata.labels", "keys": [f"{driver}/*" for driver in drivers]}]
        notes.review.append(
            f"{entry.what}: mayChange must be written: the log holds none of what its "
            f"{sum(seen.count for seen in unknown)} update/patch requests changed (no request "
            "bodies: record at "
            "--audit-level Request or RequestResponse); proposed: labels under the driver's "
            "name, a placeholder"
        )
    elif unknown and not base:
        # (With the base's mayChange, the base decided them.)
        notes.review.append(
            f"{entry.what}: mayChange lists what the logged writes changed; "
            f"{sum(seen.count for seen in unknown)} more "
            f"(e.g. {unknown[0].info.verb} {unknown[0].record.request_uri}) are not shown by the "
            "log (no body, or an update without the object before it): add what they change"
        )
    return entries


def _kind_keys(entry: _Entry, versions: dict[str, dict[str, Any]], notes: Notes) -> dict[str, Any]:
    """The kind-level keys the rule reads: list selector mode, subresources, pool separators,
    encodings, and the base's own (fill, apiserverImmutableConfirmed, readAcrossNodes)."""
    base, rule = entry.base, entry.rule
    doc: dict[str, Any] = {}
    if rule in (KindRule.NODE_LOCAL, KindRule.ON_NODE):
        doc["listSelector"] = _list_mode(entry, versions).value
    subresources = sorted({s.info.subresource for s in entry.requests if s.info.subresource})
    if subresources and rule in _OWN:
        # Only a base's entry decides them (no proposal is made for a subresource of an own
        # object), and the rule allows none.
        notes.not_allowed.append(
            f"{entry.what} subresources {', '.join(subresources)}: the rule allows none"
        )
    elif subresources:
        doc["subresources"] = subresources
    if rule is KindRule.NODE_LOCAL:
        if base and base.fill:
            doc["fill"] = sorted(f.value for f in base.fill)
        if (
            base
            and base.apiserver_immutable_confirmed
            and any("apiserverImmutable" in version for version in versions.values())
        ):
            # The base confirmed its CRD enforces apiserverImmutable: without the confirmation
            # the generated policy would not load.
            doc["apiserverImmutableConfirmed"] = base.qualified
        separators = base.pool_separators if base else _separators(entry, versions)
        if separators != STRICT_POOL_SEPARATORS:
            doc["poolSeparators"] = list(separators)
        if base and base.read_across_nodes:
            doc["readAcrossNodes"] = True
    encodings = _encodings(entry)
    if encodings:
        doc["encodings"] = encodings
    return doc


def _list_mode(entry: _Entry, versions: dict[str, dict[str, Any]]) -> ListSelectorMode:
    """Require, unless an allowed list lacked a pinning term (the gatekeeper injected it)."""
    across = bool(entry.base and entry.base.read_across_nodes)
    for seen in entry.requests:
        doc = versions.get(seen.info.api_version)
        if doc is None or seen.info.verb not in _COLLECTION_VERBS:
            continue
        selectors = doc.get("fieldSelectors", {})
        want = {selectors.get("node", doc["node"]): seen.caller.node}
        if entry.rule is KindRule.NODE_LOCAL:
            want[selectors.get("driver", doc["driver"])] = seen.caller.driver
            if across and seen.info.verb != "deletecollection":
                del want[selectors.get("node", doc["node"])]
        if not all(item in seen.selector for item in want.items()):
            return ListSelectorMode.INJECT
    return ListSelectorMode.REQUIRE


def _separators(entry: _Entry, versions: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    seen = set(STRICT_POOL_SEPARATORS)
    for version, doc in versions.items():
        if "pool" in doc:
            pool = tuple(doc["pool"].split("."))
            seen.update(separators_seen(entry.traffic.objects(version), pool))
    return tuple(sep for sep in ("/", "-", ".") if sep in seen)


def _encodings(entry: _Entry) -> list[str]:
    """The body encodings to accept, where they differ from the loader's default for the group
    (docs/policy.md, "Request bodies"): the base's, and those the gatekeeper's log names."""
    built_in = entry.traffic.group in BUILT_IN_GROUPS
    default = {"json", "protobuf"} if built_in else {"json"}
    accepted = set(entry.base.encodings) if entry.base else set(default)
    accepted |= {seen.encoding for seen in entry.requests if seen.encoding}
    return [name for name in ENCODINGS if name in accepted] if accepted != default else []


def _version_list(versions: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Versions with equal rules listed together, in the order their first name sorts."""
    shared: list[tuple[list[str], dict[str, Any]]] = []
    for name, rules in versions.items():
        for names, seen in shared:
            if seen == rules:
                names.append(name)
                break
        else:
            shared.append(([name], rules))
    return [{"names": names, **rules} for names, rules in shared]
