"""Policy files composed into one draft: a file's drivers, service accounts and kinds are added
to what its includes said, its ``overrides`` replace keys and versions of included kinds, and a
kind an override changed is checked by the schema again, whole, naming the file at fault."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.policy.draft import KeyPath, Located, PolicyDraft, RawKind, Source, render_path
from gatekeeper.policyfile._schema import POLICY, faults

__all__ = ["Composed", "compose", "draft"]

_SA_PREFIX = "system:serviceaccount:"
_KindKey = tuple[str, str, str]


@dataclass(slots=True)
class Composed:
    """What one file says once its includes are merged in."""

    drivers: dict[str, None] = field(default_factory=dict)
    accounts: dict[str, tuple[str, Located]] = field(default_factory=dict)
    """``system:serviceaccount:<ns>:<name>`` → (driver, where it was mapped)."""
    unbound: Located | None = None
    unbound_conflict: tuple[Located, Located] | None = None
    kinds: dict[_KindKey, RawKind] = field(default_factory=dict)
    """(group, resource, rule) → the kind: a resource may be listed once per rule."""
    overridden: set[_KindKey] = field(default_factory=set)
    """The kinds an override changed: checked by the schema again once composed."""


def compose(source: Source, doc: Mapping[str, Any], includes: list[Composed]) -> Composed:
    """File ``source`` (``doc``, valid by the schema) over what its includes said, in order."""
    merged = Composed()
    for part in includes:
        _merge_included(merged, part)
    for name in doc.get("drivers", ()):
        merged.drivers[name] = None
    _service_accounts(source, doc.get("serviceAccounts", {}), merged.accounts)
    if "unboundTokens" in doc:
        merged.unbound = Located(doc["unboundTokens"], source, ("unboundTokens",))
        merged.unbound_conflict = None
    elif merged.unbound_conflict is not None:
        first, second = merged.unbound_conflict
        source.fail(
            ("unboundTokens",),
            f"the included files disagree ({first.where}: {first.value}, {second.where}: "
            f"{second.value}): set it here",
        )
    included = set(merged.kinds)  # an override changes these; this file edits its own kinds
    _kinds(source, doc, merged, included)
    _overrides(source, doc, merged, included)
    return merged


def draft(composed: Composed, source: str, files: tuple[str, ...]) -> PolicyDraft:
    """The policy's draft, once every kind an override changed is valid as a whole."""
    for key in sorted(composed.overridden):
        _check_whole(composed.kinds[key])
    return PolicyDraft(
        source=source,
        files=files,
        drivers=frozenset(composed.drivers),
        service_accounts={user: driver for user, (driver, _) in composed.accounts.items()},
        unbound_tokens=composed.unbound,
        kinds=tuple(composed.kinds.values()),
    )


def _kinds(
    source: Source, doc: Mapping[str, Any], merged: Composed, included: set[_KindKey]
) -> None:
    for index, raw in enumerate(doc.get("kinds", ())):
        kind = _raw_kind(source, ("kinds", index), raw)
        if kind.key in included:
            kind.origin.fail(
                f"{kind.qualified} (rule {kind.rule}) is defined by "
                f"{merged.kinds[kind.key].origin.where} already: change it under `overrides` "
                "(a kind is defined once per rule)"
            )
        if kind.key in merged.kinds:
            kind.origin.fail(f"{kind.qualified} is listed twice under rule {kind.rule}")
        merged.kinds[kind.key] = kind


def _overrides(
    source: Source, doc: Mapping[str, Any], merged: Composed, included: set[_KindKey]
) -> None:
    changed: set[_KindKey] = set()
    for index, raw in enumerate(doc.get("overrides", ())):
        change = _raw_kind(source, ("overrides", index), raw)
        key = _overridden(change, included, merged)
        if key in changed:
            change.origin.fail(f"{change.qualified} is overridden twice")
        changed.add(key)
        change.keys.pop("rule", None)  # it selected the entry; it changes nothing
        merged.kinds[key].keys.update(change.keys)
        merged.kinds[key].versions.update(change.versions)
        merged.overridden.add(key)


def _raw_kind(source: Source, path: KeyPath, raw: Mapping[str, Any]) -> RawKind:
    """A ``kinds`` or ``overrides`` entry as written; a version named twice is refused."""
    keys = {
        name: Located(value, source, (*path, name))
        for name, value in raw.items()
        if name not in ("group", "resource", "versions")
    }
    versions: dict[str, Located] = {}
    for index, entry in enumerate(raw.get("versions", ())):
        where = Located(entry, source, (*path, "versions", index))
        for position, name in enumerate(entry["names"]):
            if name in versions:
                where.fail(
                    f"{name} is named twice (also at {render_path(versions[name].path)})",
                    "names",
                    position,
                )
            versions[name] = where
    return RawKind(raw["group"], raw["resource"], Located(raw, source, path), keys, versions)


def _overridden(change: RawKind, included: set[_KindKey], merged: Composed) -> _KindKey:
    """The included kind an override changes: the one of its group and resource, or (for a
    kind listed under two rules) the one of the rule it names."""
    candidates = [
        key
        for key in included
        if key[:2] == (change.group, change.resource) and change.rule in ("", key[2])
    ]
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        rules = ", ".join(sorted(key[2] for key in candidates))
        change.origin.fail(
            f"{change.qualified} is listed under rules {rules}: name the one to change (rule: …)"
        )
    listed = sorted(key[2] for key in included if key[:2] == (change.group, change.resource))
    if listed:
        change.keys["rule"].fail(
            f"{change.qualified} is listed under rule {', '.join(listed)}, not {change.rule}: "
            "an override names the rule of the entry it changes, it cannot change a rule"
        )
    defined_here = any(key[:2] == (change.group, change.resource) for key in merged.kinds)
    change.origin.fail(
        f"overrides {change.qualified}"
        + (f" (rule {change.rule})" if change.rule else "")
        + ", which no included file defines"
        + (" (this file does: edit it there)" if defined_here else "")
    )


def _check_whole(kind: RawKind) -> None:
    """A kind an override changed, checked by the schema as one kind: each fault is named
    where the value at fault was written (the override, or the file that defined the kind)."""
    entries: dict[int, tuple[Located, list[str]]] = {}
    for name, entry in kind.versions.items():
        entries.setdefault(id(entry), (entry, []))[1].append(name)
    listed = list(entries.values())
    whole = {
        "group": kind.group,
        "resource": kind.resource,
        **{name: loc.value for name, loc in kind.keys.items()},
        "versions": [{**entry.value, "names": names} for entry, names in listed],
    }
    found = faults(POLICY, whole, "kind")
    if not found:
        return
    fault = found[0]
    head, rest = (fault.path[0], fault.path[1:]) if fault.path else ("", ())
    if head == "versions" and rest and isinstance(rest[0], int):
        listed[rest[0]][0].fail(fault.message, *rest[1:])
    if isinstance(head, str) and head in kind.keys:
        kind.keys[head].fail(fault.message, *rest)
    kind.origin.fail(fault.message, *fault.path)


def _merge_included(merged: Composed, included: Composed) -> None:
    """An included file's result into what the includes before it gave."""
    merged.drivers.update(included.drivers)
    for user, (driver, where) in included.accounts.items():
        if user in merged.accounts and merged.accounts[user][0] != driver:
            other = merged.accounts[user]
            where.fail(f"is mapped to {other[0]} by {other[1].where}: one driver per account")
        merged.accounts.setdefault(user, (driver, where))
    for key, kind in included.kinds.items():
        if key in merged.kinds:
            kind.origin.fail(
                f"{kind.qualified} is defined by {merged.kinds[key].origin.where} too: include "
                "one of them"
            )
        merged.kinds[key] = kind
    merged.overridden |= included.overridden
    if included.unbound is not None:
        if merged.unbound is not None and merged.unbound.value != included.unbound.value:
            merged.unbound_conflict = (merged.unbound, included.unbound)
        else:
            merged.unbound = included.unbound


def _service_accounts(
    source: Source, raw: Mapping[str, list[str]], mapped: dict[str, tuple[str, Located]]
) -> None:
    """``serviceAccounts``: driver → ``[namespace/name, …]``, as the user names a token's
    TokenReview gives (``system:serviceaccount:<namespace>:<name>``) → driver."""
    for driver, accounts in raw.items():
        for index, account in enumerate(accounts):
            namespace, _, name = account.partition("/")
            where = Located(account, source, ("serviceAccounts", driver, index))
            user = f"{_SA_PREFIX}{namespace}:{name}"
            if user in mapped and (mapped[user][0] != driver or mapped[user][1].source is source):
                other = mapped[user]
                by = "" if other[1].source is source else f" by {other[1].where}"
                where.fail(
                    f"{account} is mapped to {other[0]} already{by}: a service account "
                    "identifies one driver"
                )
            mapped[user] = (driver, where)
