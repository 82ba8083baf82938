"""Which rule decides each verb of a resource: the base policy's entry where it lists the verb,
else the narrowest rule that every logged request of that verb fits (docs/policy.md, "Rules").

Each verb goes to one rule, so a resource used under two rules (pods read on the node, the own
pod patched) becomes two entries with disjoint verbs, as the policy language requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gatekeeper.audit.tools.generate._observe import Observed, Traffic
from gatekeeper.audit.tools.generate._paths import (
    OnNodeField,
    cel_scope,
    node_local_paths,
    on_node_field,
)
from gatekeeper.policy import Field, KindRule, KindSpec
from gatekeeper.policy.model import BUILT_IN_GROUPS, OWN_NODE_VERBS

__all__ = ["CUSTOM_PREFERENCE", "PREFERENCE", "Assignment", "Facts", "assign", "facts_of"]

PREFERENCE = (
    KindRule.OWN_NODE,
    KindRule.OWN_POD,
    KindRule.ON_NODE,
    KindRule.DRIVER_NAMESPACE,
    KindRule.NODE_LOCAL,
    KindRule.CEL,
    KindRule.DRIVER_CREDENTIALS,
)
"""Rules a log can propose for a built-in kind, narrowest first: the first that fits every
request of a verb decides it. ``DriverCredentials`` fits any request of a token caller: the
driver's own RBAC decides, as it did when the driver went direct."""
CUSTOM_PREFERENCE = (
    KindRule.OWN_NODE,
    KindRule.OWN_POD,
    KindRule.ON_NODE,
    KindRule.NODE_LOCAL,
    KindRule.CEL,
    KindRule.DRIVER_CREDENTIALS,
    KindRule.DRIVER_NAMESPACE,
)
"""The same for a custom resource (a group outside :data:`BUILT_IN_GROUPS`): in the driver's
namespace, its own credentials come first. The driver's RBAC for its own CRDs exists already
(it went direct), and rule DriverNamespace would instead give every node's gatekeeper the
right to write every such object in that namespace."""
_READS = frozenset({"get", "list", "watch"})


@dataclass(frozen=True, slots=True)
class Facts:
    """What each rule needs to decide one resource's requests, by API version: from the base
    policy where it has the rule's entry, else from the log."""

    node_local: Mapping[str, dict[str, str]]
    on_node: Mapping[str, OnNodeField]
    scope: Mapping[str, str]
    own_node: bool
    own_pod: bool


@dataclass(slots=True)
class Assignment:
    """The requests of one resource by the rule that decides their verb."""

    rules: dict[KindRule, list[Observed]] = field(default_factory=dict)
    unfit: list[str] = field(default_factory=list)
    """Why some requests fit no rule (the header's NOT ALLOWED lines)."""


def facts_of(traffic: Traffic, base: KindSpec | None) -> Facts:
    entries = {entry.rule: entry for entry in (base.entries if base else ())}
    versions = sorted({seen.info.api_version for seen in traffic.requests})
    key = (traffic.group, traffic.resource)
    node_local: dict[str, dict[str, str]] = {}
    on_node: dict[str, OnNodeField] = {}
    scope: dict[str, str] = {}
    for version in versions:
        objects = traffic.objects(version)
        inferred = node_local_paths(objects)
        if inferred is not None:
            node_local[version] = inferred
        listed = entries.get(KindRule.ON_NODE)
        spec = listed.versions.get(version) if listed else None
        if spec is not None:
            on_node[version] = OnNodeField(spec.paths[Field.NODE], spec.selectors[Field.NODE])
        else:
            requests = [seen for seen in traffic.requests if seen.info.api_version == version]
            found = on_node_field(requests, core_pods=key == ("", "pods"))
            if found is not None:
                on_node[version] = found
        listed = entries.get(KindRule.CEL)
        spec = listed.versions.get(version) if listed else None
        expression = spec.cel.scope.source if spec and spec.cel.scope else cel_scope(objects)
        if expression is not None:
            scope[version] = expression
    base_node_local = entries.get(KindRule.NODE_LOCAL)
    if base_node_local is not None:
        # The base locates these fields: whatever the log suggests, its paths decide.
        node_local.update({version: {} for version in base_node_local.versions})
    return Facts(
        node_local,
        on_node,
        scope,
        own_node=key == ("", "nodes") or KindRule.OWN_NODE in entries,
        own_pod=key == ("", "pods") or KindRule.OWN_POD in entries,
    )


def assign(traffic: Traffic, base: KindSpec | None, facts: Facts) -> Assignment:
    """Each verb to the base's entry that lists it, else to the narrowest rule all its requests
    fit; requests that fit no rule the others fit are named, not allowed."""
    assignment = Assignment()
    order = PREFERENCE if traffic.group in BUILT_IN_GROUPS else CUSTOM_PREFERENCE
    by_verb: dict[str, list[Observed]] = {}
    for seen in traffic.requests:
        by_verb.setdefault(seen.info.verb, []).append(seen)
    unfit: dict[KindRule | None, list[Observed]] = {}
    for verb, requests in by_verb.items():
        listed = next((e for e in (base.entries if base else ()) if verb in e.verbs), None)
        if listed is not None:
            assignment.rules.setdefault(listed.rule, []).extend(requests)
            continue
        fits = [candidates(seen, facts, traffic.namespaced) for seen in requests]
        best = max(order, key=lambda rule: (sum(rule in fit for fit in fits), -order.index(rule)))
        fitting = [seen for seen, fit in zip(requests, fits, strict=True) if best in fit]
        rest = [seen for seen, fit in zip(requests, fits, strict=True) if best not in fit]
        if fitting:
            assignment.rules.setdefault(best, []).extend(fitting)
        unfit.setdefault(best if fitting else None, []).extend(rest)
    for fitted, rest in unfit.items():
        if rest:
            assignment.unfit.append(_unfit(traffic, rest, fitted))
    return assignment


def candidates(seen: Observed, facts: Facts, namespaced: bool) -> set[KindRule]:
    """The rules that would decide ``seen`` as the log shows it was meant."""
    info, caller = seen.info, seen.caller
    version, verb = info.api_version, info.verb
    own = verb in OWN_NODE_VERBS and not info.subresource
    own_pod = (caller.account[0], caller.pod) if caller.account and caller.pod else None
    fits = {
        KindRule.OWN_NODE: facts.own_node and own and not info.namespace
        and info.name == caller.node,
        KindRule.OWN_POD: facts.own_pod and own and (info.namespace, info.name) == own_pod,
        # Objects that name the driver too are NodeLocal's: it checks both.
        KindRule.ON_NODE: verb in _READS and version not in facts.node_local
        and _on_node(seen, facts.on_node.get(version)),
        KindRule.DRIVER_NAMESPACE: namespaced and info.namespace in caller.namespaces,
        KindRule.NODE_LOCAL: version in facts.node_local,
        KindRule.CEL: version in facts.scope and verb != "deletecollection",
        KindRule.DRIVER_CREDENTIALS: caller.token,
    }  # fmt: skip
    return {rule for rule, fit in fits.items() if fit}


def _on_node(seen: Observed, node_field: OnNodeField | None) -> bool:
    """A list or watch pinned to this node, or a get of an object on it (or one the log does
    not hold: assumed, and said so in the header)."""
    if node_field is None:
        return False
    if seen.info.verb == "get":
        return seen.node_fields is None or node_field.path in seen.node_fields
    return (node_field.selector, seen.caller.node) in seen.forwarded


def _unfit(traffic: Traffic, rest: list[Observed], best: KindRule | None) -> str:
    """Why ``rest`` fit no rule: none at all, or not the one the other requests of their verb
    fit (``best``)."""
    versions = sorted({seen.info.api_version for seen in rest})
    verbs = ", ".join(sorted({seen.info.verb for seen in rest}))
    count = sum(seen.count for seen in rest)
    what = f"{traffic.qualified} {', '.join(versions)} {verbs} ({count} requests seen, e.g. "
    what += f"{rest[0].record.request_uri})"
    if best is not None:
        return f"{what}: they fit no rule that the other {verbs} requests fit (rule {best.value})"
    if any(traffic.objects(version) for version in versions):
        why = "no field of the logged objects holds the driver and node names"
    else:
        why = (
            "the log holds no object of it to find the driver and node in (record at "
            "--audit-level Request or RequestResponse)"
        )
    if traffic.namespaced:
        why += "; not in the driver's own namespace"
    return (
        f"{what}: {why}; and {rest[0].caller.driver} showed no ServiceAccount token to forward "
        "them under its own credentials"
    )
