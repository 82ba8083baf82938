"""Which rule decides each verb of a resource: the base policy's entry where it lists the verb,
else the narrowest rule that every logged request of that verb fits (docs/policy.md, "Rules").

Each verb goes to one rule, so a resource used under two rules (pods read on the node, the own
pod patched) becomes two entries with disjoint verbs, as the policy language requires.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gatekeeper.audit.tools.generate._observe import Observed, Traffic
from gatekeeper.audit.tools.generate._paths import (
    OnNodeField,
    cel_scope,
    node_local_paths,
    on_node_field,
)
from gatekeeper.policy import Field, KindRule, KindSpec, VersionSpec
from gatekeeper.policy.model import BUILT_IN_GROUPS, OWN_NODE_VERBS

__all__ = ["CUSTOM_PREFERENCE", "PREFERENCE", "Assignment", "Facts", "assign"]

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


class Facts:
    """What each rule needs to decide one resource's requests, by API version: from the base
    policy where it has the rule's entry, else from the log. Computed when first asked: most
    verbs are the base's, and their objects need not be searched."""

    def __init__(self, traffic: Traffic, base: KindSpec | None) -> None:
        self._traffic = traffic
        self._entries = {entry.rule: entry for entry in (base.entries if base else ())}
        key = (traffic.group, traffic.resource)
        self.own_node = key == ("", "nodes") or KindRule.OWN_NODE in self._entries
        self.own_pod = key == ("", "pods") or KindRule.OWN_POD in self._entries
        self._node_local: dict[str, dict[str, str] | None] = {}
        self._on_node: dict[str, OnNodeField | None] = {}
        self._scope: dict[str, str | None] = {}

    def _listed(self, rule: KindRule, version: str) -> VersionSpec | None:
        entry = self._entries.get(rule)
        return entry.versions.get(version) if entry else None

    def node_local(self, version: str) -> dict[str, str] | None:
        """Where objects name driver, node and pool ({} where the base's paths decide)."""
        if version not in self._node_local:
            listed = self._listed(KindRule.NODE_LOCAL, version)
            inferred = {} if listed else node_local_paths(self._traffic.objects(version))
            self._node_local[version] = inferred
        return self._node_local[version]

    def on_node(self, version: str) -> OnNodeField | None:
        if version not in self._on_node:
            listed = self._listed(KindRule.ON_NODE, version)
            found: OnNodeField | None
            if listed is not None:
                found = OnNodeField(listed.paths[Field.NODE], listed.selectors[Field.NODE])
            else:
                traffic = self._traffic
                requests = [seen for seen in traffic.requests if seen.info.api_version == version]
                pods = (traffic.group, traffic.resource) == ("", "pods")
                found = on_node_field(requests, core_pods=pods)
            self._on_node[version] = found
        return self._on_node[version]

    def scope(self, version: str) -> str | None:
        """Rule CEL's scope expression."""
        if version not in self._scope:
            listed = self._listed(KindRule.CEL, version)
            if listed is not None and listed.cel.scope is not None:
                self._scope[version] = listed.cel.scope.source
            else:
                self._scope[version] = cel_scope(self._traffic.objects(version))
        return self._scope[version]


@dataclass(slots=True)
class Assignment:
    """The requests of one resource by the rule that decides their verb."""

    rules: dict[KindRule, list[Observed]] = field(default_factory=dict)
    unfit: list[str] = field(default_factory=list)
    """Why some requests fit no rule (the header's NOT ALLOWED lines)."""


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
        fits = [_candidates(seen, facts, traffic.namespaced) for seen in requests]
        best = max(order, key=lambda rule: (_fitting(rule, requests, fits), -order.index(rule)))
        fitting = [seen for seen, fit in zip(requests, fits, strict=True) if best in fit]
        rest = [seen for seen, fit in zip(requests, fits, strict=True) if best not in fit]
        if fitting:
            assignment.rules.setdefault(best, []).extend(fitting)
        unfit.setdefault(best if fitting else None, []).extend(rest)
    for fitted, rest in unfit.items():
        if rest:
            assignment.unfit.append(_unfit(traffic, rest, fitted))
    return assignment


def _fitting(rule: KindRule, requests: list[Observed], fits: list[set[KindRule]]) -> int:
    """How many of the logged requests ``rule`` fits."""
    return sum(seen.count for seen, fit in zip(requests, fits, strict=True) if rule in fit)


def _candidates(seen: Observed, facts: Facts, namespaced: bool) -> set[KindRule]:
    """The rules that would decide ``seen`` as the log shows it was meant."""
    info, caller = seen.info, seen.caller
    version, verb = info.api_version, info.verb
    own = verb in OWN_NODE_VERBS and not info.subresource
    own_pod = (caller.account[0], caller.pod) if caller.account and caller.pod else None
    node_local = facts.node_local(version) is not None
    fits = {
        KindRule.OWN_NODE: facts.own_node and own and not info.namespace
        and info.name == caller.node,
        KindRule.OWN_POD: facts.own_pod and own and (info.namespace, info.name) == own_pod,
        # Objects that name the driver too are NodeLocal's: it checks both.
        KindRule.ON_NODE: verb in _READS and not node_local
        and _on_node(seen, facts.on_node(version)),
        KindRule.DRIVER_NAMESPACE: namespaced and info.namespace in caller.namespaces,
        KindRule.NODE_LOCAL: node_local,
        KindRule.CEL: verb != "deletecollection" and facts.scope(version) is not None,
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
