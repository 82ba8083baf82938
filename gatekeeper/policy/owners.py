"""Whose an object is, rule by rule: each rule's :class:`~gatekeeper.policy.plan.Ownership`, built
once per request when it is planned (DESIGN §4.3, docs/policy.md#rules)."""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.codec.jsonpath import MISSING, FieldPath, get_field
from gatekeeper.policy.admission import CelContext
from gatekeeper.policy.cel import CelRules
from gatekeeper.policy.changes import forbidden_change
from gatekeeper.policy.model import Changeable, VersionSpec
from gatekeeper.policy.ownership import driver_violation, ownership_violation
from gatekeeper.rule import Rule, Violation
from gatekeeper.types import KubeObject

__all__ = [
    "NOT_IN_SCOPE",
    "CelOwner",
    "NamespaceOwner",
    "NodeLocalOwner",
    "OnNodeOwner",
    "OwnObjectOwner",
]

NOT_IN_SCOPE = "not in the caller's scope (the policy's CEL scope does not hold)"


@dataclass(frozen=True, slots=True)
class NodeLocalOwner:
    """The object names the caller's driver, this node and a pool prefixed by it."""

    version: VersionSpec
    driver: str
    node: str
    hidden: bool = False
    any_node: bool = False
    """A read of a kind whose drivers read their own objects on every node
    (``readAcrossNodes``): the stored object need only be the caller's."""

    def stored(self, obj: KubeObject) -> Violation | None:
        if self.any_node:
            return driver_violation(self.version, obj, self.driver)
        return ownership_violation(self.version, obj, self.driver, self.node, stored=True)

    def written(self, obj: KubeObject, old: KubeObject | None) -> Violation | None:
        return ownership_violation(self.version, obj, self.driver, self.node)


@dataclass(frozen=True, slots=True)
class OnNodeOwner:
    """The object is on this node (its node field); it is only read."""

    path: FieldPath
    node: str
    hidden: bool = False

    def stored(self, obj: KubeObject) -> Violation | None:
        value = get_field(obj, self.path)
        if value == self.node:
            return None
        shown = "" if value is MISSING or value is None else value
        return Violation(
            Rule.NODE_MISMATCH,
            f'the stored object\'s {".".join(self.path)} "{shown}" does not match this node '
            f'"{self.node}"',
        )

    def written(self, obj: KubeObject, old: KubeObject | None) -> Violation | None:
        return Violation(Rule.VERB_NOT_ALLOWED, "objects on this node are only read")


@dataclass(frozen=True, slots=True)
class OwnObjectOwner:
    """This node's own object, or the caller's own pod (``pod_uid``: the one its token names,
    not another pod created later under the same name): a write changes only ``may_change``."""

    may_change: tuple[Changeable, ...]
    pod_uid: str = ""
    hidden: bool = False

    def stored(self, obj: KubeObject) -> Violation | None:
        if not self.pod_uid:
            return None
        uid = get_field(obj, ("metadata", "uid"))
        if uid == self.pod_uid:
            return None
        return Violation(
            Rule.OWN_OBJECT_ONLY,
            f'the stored pod\'s metadata.uid "{uid if isinstance(uid, str) else ""}" is not the '
            f'caller\'s pod (its token names pod uid "{self.pod_uid}")',
        )

    def written(self, obj: KubeObject, old: KubeObject | None) -> Violation | None:
        if old is None:
            return Violation(
                Rule.OWN_OBJECT_ONLY, "an own object is never created through the gatekeeper"
            )
        return forbidden_change(old, obj, self.may_change)


@dataclass(frozen=True, slots=True)
class NamespaceOwner:
    """Any object in the caller's namespace (the path named it: checked when planned)."""

    hidden: bool = False

    def stored(self, obj: KubeObject) -> Violation | None:
        return None

    def written(self, obj: KubeObject, old: KubeObject | None) -> Violation | None:
        return None


@dataclass(frozen=True, slots=True)
class CelOwner:
    """The version's CEL ``scope`` holds for the object. Out of scope reads as absent (404), as
    for claims, so a driver cannot learn which other objects exist. A write's scope is checked
    with its validations (the object to store and the one stored)."""

    cel: CelRules
    context: CelContext
    verb: str
    hidden: bool = True

    def stored(self, obj: KubeObject) -> Violation | None:
        if self.context.holds_scope(self.cel, obj, self.verb):
            return None
        return Violation(Rule.NOT_IN_SCOPE, NOT_IN_SCOPE)

    def written(self, obj: KubeObject, old: KubeObject | None) -> Violation | None:
        return None

    def __call__(self, obj: object) -> bool:
        """The filter of a list or watch: whether an object reaches the driver."""
        return isinstance(obj, dict) and self.stored(obj) is None
