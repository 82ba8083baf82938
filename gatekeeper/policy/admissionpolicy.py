"""The policy as a ValidatingAdmissionPolicy that binds the gatekeeper's own ServiceAccount to its
node at the apiserver: the second layer (DESIGN §4.3a, docs/admission-policy.md).

Pure: a :class:`~gatekeeper.policy.model.Policy` in, the validations out, each with what it
protects. Every rule the gatekeeper decides on a write becomes CEL over ``object`` and
``oldObject``, with the node from the gatekeeper's pod-bound token
(``authentication.kubernetes.io/node-name``) as ``variables.node``. The apiserver never sees the
calling driver, so what the gatekeeper checks against it is checked against every driver the
policy names: an expression reading ``variables.driver`` is exported as ``variables.drivers.exists
(__driver, …)``, which holds whenever the gatekeeper's own check held (the caller is one of
them), so the admission policy never refuses what the gatekeeper allowed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from gatekeeper.codec.jsonpath import FieldPath
from gatekeeper.policy._celtext import unchanged_but
from gatekeeper.policy._managedcel import managed_fields_expression
from gatekeeper.policy.cel import CelRules, Program, rewrite
from gatekeeper.policy.model import (
    ANY_DRIVER,
    Changeable,
    Field,
    KindRule,
    KindSpec,
    Policy,
    VersionSpec,
)

__all__ = [
    "NODE_VARIABLE",
    "Exported",
    "NotExported",
    "PolicyExport",
    "export_policy",
]

NODE_VARIABLE = "request.userInfo.extra[?'authentication.kubernetes.io/node-name'][0].orValue('')"
"""``variables.node`` at the apiserver: the node the gatekeeper's pod-bound token names."""

_WRITES = {
    "create": "CREATE",
    "update": "UPDATE",
    "patch": "UPDATE",
    "delete": "DELETE",
    "deletecollection": "DELETE",
}
# Built-in variables the apiserver cannot know: it sees the gatekeeper, not the driver's pod.
_UNKNOWABLE = ("serviceAccount", "pod", "podUID")


@dataclass(frozen=True, slots=True)
class Exported:
    """One validation of the admission policy, and what it protects (its comment)."""

    protects: str
    expression: str
    message: str
    reason: str = "Forbidden"


@dataclass(frozen=True, slots=True)
class NotExported:
    """A policy expression that cannot run at the apiserver, and why (a comment in the output)."""

    where: str
    source: str
    why: str


@dataclass(frozen=True, slots=True)
class PolicyExport:
    """What :func:`export_policy` gives: the resource rules to match, the variables, the
    validations, and the expressions left out."""

    resource_rules: tuple[dict[str, list[str]], ...]
    variables: tuple[tuple[str, str], ...]
    validations: tuple[Exported, ...]
    not_exported: tuple[NotExported, ...]


def export_policy(policy: Policy, drivers: Iterable[str] = ()) -> PolicyExport:
    """The admission policy's parts for ``policy`` (with ``drivers`` added, as ``--driver``)."""
    named = sorted(set(policy.drivers) | set(drivers))
    if ANY_DRIVER in named:
        raise ValueError(
            'drivers: "*" names no driver: the admission policy checks the driver fields '
            "against the drivers the policy names"
        )
    namespaces = sorted({user.split(":")[2] for user in policy.service_accounts})
    variables = (
        ("node", NODE_VARIABLE),
        ("drivers", json.dumps(named)),
        ("namespaces", json.dumps(namespaces)),
    )
    validations = [
        Exported(
            "The gatekeeper's token names its node: every check below binds writes to it.",
            "variables.node != ''",
            "the gatekeeper's credential names no node (authentication.kubernetes.io/node-name): "
            "it must be the pod-bound ServiceAccount token of a gatekeeper pod",
        ),
        Exported(
            "Every kind: metadata.managedFields change only as the apiserver records the write "
            "(one entry, the writer's; the others lose only the fields it took over).",
            managed_fields_expression(),
            "metadata.managedFields may change only as the apiserver records this write: a "
            "write may not set them",
        ),
    ]
    skipped: list[NotExported] = []
    rules: dict[tuple[str, str], set[str]] = {}
    for key in sorted(policy.kinds):
        for entry in policy.kinds[key].entries:
            operations = {_WRITES[verb] for verb in entry.verbs if verb in _WRITES}
            if not operations or entry.rule is KindRule.DRIVER_CREDENTIALS:
                continue  # never written with the gatekeeper's credentials
            for resource in _resources(entry):
                rules.setdefault((entry.group, resource), set()).update(operations)
            validations.append(_versions_known(entry))
            for names, version in _version_groups(entry):
                guard = _guard(entry, names)
                for item in _structural(entry, version):
                    validations.append(_guarded(item, guard))
                exported, left = _carried(entry, names, version.cel)
                validations += [_guarded(item, guard) for item in exported]
                skipped += left
    resource_rules = tuple(
        {
            "apiGroups": [group],
            "apiVersions": ["*"],
            "operations": sorted(ops),
            "resources": [resource],
        }
        for (group, resource), ops in sorted(rules.items())
    )
    return PolicyExport(resource_rules, variables, tuple(validations), tuple(skipped))


def _resources(entry: KindSpec) -> list[str]:
    if entry.rule is KindRule.ALLOCATED_TO_DRIVER:
        return [f"{entry.resource}/status"]  # its only writes
    return [entry.resource, *(f"{entry.resource}/{sub}" for sub in sorted(entry.subresources))]


def _version_groups(entry: KindSpec) -> list[tuple[list[str], VersionSpec]]:
    """The versions that share one rule set, listed together."""
    groups: list[tuple[list[str], VersionSpec]] = []
    for name, spec in entry.versions.items():
        for names, shared in groups:
            if shared is spec:
                names.append(name)
                break
        else:
            groups.append(([name], spec))
    return groups


def _of_kind(entry: KindSpec) -> str:
    return (
        f"request.resource.group == {json.dumps(entry.group)} && "
        f"request.resource.resource == {json.dumps(entry.resource)}"
    )


def _guard(entry: KindSpec, names: list[str]) -> str:
    return f"{_of_kind(entry)} && request.resource.version in {json.dumps(sorted(names))}"


def _guarded(item: Exported, guard: str) -> Exported:
    return Exported(item.protects, f"!({guard}) ||\n({item.expression})", item.message, item.reason)


def _versions_known(entry: KindSpec) -> Exported:
    versions = sorted(entry.versions)
    return Exported(
        f"{entry.qualified}: only the versions the policy knows (the gatekeeper sends no other).",
        f"!({_of_kind(entry)}) || request.resource.version in {json.dumps(versions)}",
        f"{entry.qualified}: this version is not in the gatekeeper's policy",
    )


# --- structural rules ---------------------------------------------------------------------------


def _structural(entry: KindSpec, version: VersionSpec) -> list[Exported]:
    q = entry.qualified
    if entry.rule is KindRule.NODE_LOCAL:
        return _node_local(q, version)
    if entry.rule is KindRule.ALLOCATED_TO_DRIVER:
        return _allocated(q, version)
    if entry.rule is KindRule.OWN_NODE:
        changes = unchanged_but(version.may_change)
        return [
            Exported(
                f"{q}: only this node's own object.",
                "request.operation != 'UPDATE' || object.metadata.name == variables.node",
                f"the gatekeeper may write only this node's own {entry.kind}",
            ),
            Exported(
                f"{q}: a write changes only what mayChange names.",
                "request.operation != 'UPDATE' || " + changes,
                f"a write of this node's {entry.kind} may change only {_shown(version.may_change)}",
            ),
        ]
    if entry.rule is KindRule.OWN_POD:
        changes = unchanged_but(version.may_change)
        return [
            Exported(
                f"{q}: only pods on this node (the apiserver cannot tell the caller's own).",
                "request.operation != 'UPDATE' || "
                "oldObject.spec.?nodeName.orValue('') == variables.node",
                f"the gatekeeper may write only {entry.kind}s on its own node",
            ),
            Exported(
                f"{q}: a write changes only what mayChange names.",
                "request.operation != 'UPDATE' || " + changes,
                f"a write of a {entry.kind} may change only {_shown(version.may_change)}",
            ),
        ]
    if entry.rule is KindRule.DRIVER_NAMESPACE:
        return [
            Exported(
                f"{q}: only in the namespaces of the drivers' ServiceAccounts.",
                "request.namespace in variables.namespaces",
                f"{q} may be written only in the drivers' own namespaces",
            ),
        ]
    if entry.rule is KindRule.CEL and version.cel.scope is not None:
        return _scoped(q, version.cel)
    return []


def _path(root: str, path: FieldPath, default: str = "''") -> str:
    """``root.?a.?b.orValue(default)``: absent anywhere reads as ``default``."""
    return root + "".join(f".?{step}" for step in path) + f".orValue({default})"


def _node_local(q: str, version: VersionSpec) -> list[Exported]:
    def owned(o: str) -> str:
        driver = f"{_path(o, version.paths[Field.DRIVER])} in variables.drivers"
        node = f"{_path(o, version.paths[Field.NODE])} == variables.node"
        if version.node_selector is not None:
            exact = (
                "{'nodeSelectorTerms': [{'matchFields': [{'key': 'metadata.name', "
                "'operator': 'In', 'values': [variables.node]}]}]}"
            )
            selector = _path(o, version.node_selector, "{}")
            owners = (
                f"{o}.metadata.?ownerReferences.orValue([]).all(r, r.kind != 'Node' || "
                "r.name == variables.node)"
            )
            unnamed = f"{_path(o, version.paths[Field.NODE])} == ''"
            node = f"({node} || ({unnamed} && {selector} == {exact} && {owners}))"
        checks = [driver, node]
        if (pool := version.paths.get(Field.POOL)) is not None:
            value = _path(o, pool)
            prefixes = " || ".join(
                f"{value}.startsWith(variables.node + {json.dumps(sep)})"
                for sep in version.pool_separators
            )
            checks.append(f"({value} == variables.node || {prefixes})")
        return " && ".join(checks)

    # Two comparisons, not ``in [null, false]``: the apiserver's CEL refuses a list literal
    # mixing types ("expected type 'null' but found 'bool'").
    forbidden = " && ".join(
        f"({value} == null || {value} == false)"
        for value in (_path("object", path, "null") for path in version.forbidden)
    )
    out = [
        Exported(
            f"{q}: what is written names a policy driver, this node, and a pool prefixed by it.",
            "request.operation == 'DELETE' || " + owned("object"),
            f"{q}: the object must name one of the node's drivers, this node, and a pool "
            "prefixed by the node name",
        ),
        Exported(
            f"{q}: what is stored and changed or deleted is a policy driver's on this node.",
            "request.operation == 'CREATE' || " + owned("oldObject"),
            f"{q}: the stored object belongs to another node or driver",
        ),
    ]
    if forbidden:
        out.append(
            Exported(
                f"{q}: fields a node-local driver may not set.",
                "request.operation == 'DELETE' || " + forbidden,
                f"{q}: {', '.join('.'.join(p) for p in version.forbidden)} must not be set by a "
                "node-local driver",
            )
        )
    return out


def _allocated(q: str, version: VersionSpec) -> list[Exported]:
    paths = version.allocation
    assert paths is not None
    results = _path("oldObject", paths.results, "[]")
    result_driver = _path("r", paths.result_driver)
    terms = _path("oldObject", (*paths.node_selector, "nodeSelectorTerms"), "[]")
    on_node = (
        f"{terms}.exists(t, t.?matchFields.orValue([]).exists(f, f.key == 'metadata.name' && "
        "f.operator == 'In' && variables.node in f.values) || t.?matchExpressions.orValue([])"
        ".exists(e, e.key == 'kubernetes.io/hostname' && e.operator == 'In' && variables.node "
        "in e.values))"
    )
    new, old = _path("object", paths.devices, "[]"), _path("oldObject", paths.devices, "[]")
    entry_driver = _path("e", paths.device_driver)
    entries = (
        f"{new}.all(e, {entry_driver} in variables.drivers || e in {old}) && "
        f"{old}.all(e, {entry_driver} in variables.drivers || e in {new})"
    )
    status = paths.devices[:-1]
    rest = ""
    if status:
        new_status, old_status = _path("object", status, "{}"), _path("oldObject", status, "{}")
        last = json.dumps(paths.devices[-1])
        rest = (
            f" && {new_status}.all(k, k == {last} || (k in {old_status} && {new_status}[k] == "
            f"{old_status}[k])) && {old_status}.all(k, k == {last} || k in {new_status})"
        )
    return [
        Exported(
            f"{q}: only a claim allocated to a policy driver on this node.",
            f"{results}.exists(r, {result_driver} in variables.drivers) && {on_node}",
            f"{q}: the claim is not allocated to the node's drivers on this node",
        ),
        Exported(
            f"{q}: only the policy drivers' own status entries change.",
            entries + rest,
            f"{q}: a status write may change only the entries of the node's drivers",
        ),
    ]


def _scoped(q: str, cel: CelRules) -> list[Exported]:
    scope = cel.scope
    assert scope is not None
    out: list[Exported] = []
    for root, skip, what in (("object", "DELETE", "written"), ("oldObject", "CREATE", "stored")):
        # The scope is written on ``object``: on the stored object, its checked tree's
        # references to ``object`` (and its variables') are renamed, not bound with ``cel.bind``,
        # which the apiserver's admission CEL does not declare.
        exported = _portable(scope, cel, root)
        if exported is None:
            return []
        out.append(
            Exported(
                f"{q}: the {what} object is in the scope of one of the node's drivers.",
                f"request.operation == '{skip}' || {exported}",
                f"{q}: the {what} object is not in the scope of the node's drivers",
            )
        )
    return out


# --- carried-over CEL ---------------------------------------------------------------------------


def _carried(
    entry: KindSpec, names: list[str], cel: CelRules
) -> tuple[list[Exported], list[NotExported]]:
    exported: list[Exported] = []
    skipped: list[NotExported] = []
    where = f"{entry.qualified} {', '.join(names)}"
    for validation in cel.validations:
        portable = _portable(validation.program, cel)
        if portable is None:
            skipped.append(
                NotExported(
                    f"{where} {validation.name}",
                    validation.program.source,
                    _why_not(validation.program, cel),
                )
            )
            continue
        message = validation.message or f"failed expression: {validation.program.source}"
        exported.append(
            Exported(
                f"{where}: the policy's validation {validation.name}.",
                portable,
                message,
                validation.reason.value,
            )
        )
    return exported, skipped


def _reads(program: Program, cel: CelRules) -> frozenset[str]:
    """The declarations ``program`` reads, through the kind's variables too."""
    names = set(program.names)
    for variable in cel.needed(program):
        names |= variable.program.names
    return frozenset(names)


def _inlined(program: Program, cel: CelRules, root: str) -> str | None:
    """The source with the kind's own variables replaced by their expressions (the admission
    policy's variables are shared by every kind, a policy's are not), ``object`` read as
    ``root``, and the caller's driver and namespace as the exported comprehensions' variables;
    None when a name cannot be replaced where it is written (a comprehension variable of the
    same name would capture it)."""
    variables = {f"variables.{variable.name}": variable for variable in cel.variables}

    def replace(name: str) -> tuple[str, frozenset[str]] | None:
        if name in variables:
            inner = _inlined(variables[name].program, cel, root)
            if inner is None:
                raise _Captured
            return f"({inner})", _reads(variables[name].program, cel)
        if name in _RENAMED:
            return _RENAMED[name], frozenset()
        if name == "object" and root != "object":
            return root, frozenset({root})
        return None

    try:
        return rewrite(program, replace)
    except _Captured:
        return None


class _Captured(Exception):
    """An inlined variable that cannot be placed where it is read."""


_RENAMED = {"variables.driver": "__driver", "variables.namespace": "__namespace"}


def _portable(program: Program, cel: CelRules, root: str = "object") -> str | None:
    names = _reads(program, cel)
    if any(name.startswith("request.userInfo") for name in names):
        return None
    if any(f"variables.{name}" in names for name in _UNKNOWABLE):
        return None
    source = _inlined(program, cel, root)
    if source is None:
        return None
    if "variables.namespace" in names:
        source = f"variables.namespaces.exists(__namespace, {source})"
    if "variables.driver" in names:
        source = f"variables.drivers.exists(__driver, {source})"
    return source


def _why_not(program: Program, cel: CelRules) -> str:
    names = _reads(program, cel)
    if any(name.startswith("request.userInfo") for name in names):
        return "it reads request.userInfo: at the apiserver that is the gatekeeper, not the driver"
    if any(f"variables.{name}" in names for name in _UNKNOWABLE):
        return (
            "it reads the caller's ServiceAccount or pod (variables.serviceAccount, pod, podUID), "
            "which the apiserver never sees: the request carries the gatekeeper's identity"
        )
    return (
        "a variable it reads cannot be inlined where it is read: a comprehension variable there "
        "has the name of one of the variable's own"
    )


def _shown(allowed: tuple[Changeable, ...]) -> str:
    return ", ".join(
        f"{'.'.join(e.path)}[{', '.join(e.keys)}]" if e.keys else ".".join(e.path) for e in allowed
    )
