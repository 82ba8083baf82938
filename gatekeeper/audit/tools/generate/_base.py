"""A base policy's kind entries written back as policy YAML: every key that decides a request
kept (paths, selectors, forbidden fields, apiserverImmutable, a claim's opaque and time paths,
mayChange, the CEL), so that generating changes no decision the base made."""

from __future__ import annotations

import re
from typing import Any

from gatekeeper.policy import Field, KindRule, VersionSpec
from gatekeeper.policy.build import ALLOCATION_KEYS
from gatekeeper.policy.cel import CelRules, StatusReason
from gatekeeper.policy.model import AllocationPaths, Changeable

__all__ = ["cel_doc", "may_change_entries", "version_doc"]

_UNNAMED = re.compile(r"^validations\[[0-9]+\]$")


def version_doc(spec: VersionSpec, rule: KindRule) -> dict[str, Any]:
    """One version of a base kind entry under ``rule`` (its CEL included)."""
    if rule is KindRule.ALLOCATED_TO_DRIVER and spec.allocation is not None:
        doc = _allocation_doc(spec.allocation)
    elif rule is KindRule.NODE_LOCAL:
        doc = _node_local_doc(spec)
    elif rule is KindRule.ON_NODE:
        path, selector = ".".join(spec.paths[Field.NODE]), spec.selectors[Field.NODE]
        doc = (
            {"node": path}
            if selector == path
            else {"node": path, "fieldSelectors": {"node": selector}}
        )
    elif rule in (KindRule.OWN_NODE, KindRule.OWN_POD) and spec.may_change:
        doc = {"mayChange": may_change_entries(spec.may_change)}
    else:
        doc = {}
    return {**doc, **cel_doc(spec.cel)}


def may_change_entries(entries: tuple[Changeable, ...]) -> list[dict[str, Any]]:
    return [
        {"path": ".".join(entry.path), "keys": list(entry.keys)}
        if entry.keys
        else {"path": ".".join(entry.path)}
        for entry in entries
    ]


def cel_doc(cel: CelRules) -> dict[str, Any]:
    """The kind's and the version's CEL, in evaluation order, as one version's keys: unnamed
    validations keep their names (``validations[<i>]``) because their order is kept."""
    doc: dict[str, Any] = {}
    if cel.variables:
        doc["variables"] = [
            {"name": variable.name, "expression": variable.program.source}
            for variable in cel.variables
        ]
    if cel.scope is not None:
        doc["scope"] = cel.scope.source
    validations = []
    for validation in cel.validations:
        entry: dict[str, Any] = {}
        if not _UNNAMED.match(validation.name):
            entry["name"] = validation.name
        entry["expression"] = validation.program.source
        if validation.message:
            entry["message"] = validation.message
        if validation.message_expression is not None:
            entry["messageExpression"] = validation.message_expression.source
        if validation.reason is not StatusReason.FORBIDDEN:
            entry["reason"] = validation.reason.value
        validations.append(entry)
    if validations:
        doc["validations"] = validations
    return doc


def _node_local_doc(spec: VersionSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {fld.value: ".".join(path) for fld, path in spec.paths.items()}
    defaults = {fld: ".".join(spec.paths[fld]) for fld in (Field.DRIVER, Field.NODE)}
    pool = spec.selectors.get(Field.POOL)
    if any(spec.selectors[fld] != defaults[fld] for fld in defaults) or (
        pool is not None and pool != "metadata.name"
    ):
        doc["fieldSelectors"] = {fld.value: spec.selectors[fld] for fld in defaults}
        if pool is not None and pool != "metadata.name":
            doc["fieldSelectors"]["pool"] = pool
    if spec.forbidden:
        doc["forbidden"] = [".".join(path) for path in spec.forbidden]
    if spec.apiserver_immutable:
        doc["apiserverImmutable"] = [fld.value for fld in Field if fld in spec.apiserver_immutable]
    if spec.node_selector is not None:
        doc["nodeSelector"] = ".".join(spec.node_selector)
    return doc


def _allocation_doc(allocation: AllocationPaths) -> dict[str, Any]:
    doc: dict[str, Any] = {
        key: ".".join(getattr(allocation, attr)) for key, attr in ALLOCATION_KEYS.items()
    }
    # Without them a generated policy would compare opaque data by meaning, and refuse a
    # client's re-spelling of the times it read.
    for key, paths in (("opaque", allocation.opaque), ("times", allocation.times)):
        if paths:
            doc[key] = [".".join(path) for path in paths]
    return doc
