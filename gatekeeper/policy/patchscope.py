"""What a strategic-merge or apply patch of an own object (OwnNode, OwnPod) can change, read from
the patch alone, before the apiserver is asked to compute it (docs/security.md, "Patches refused
before any dry run").

A key outside ``mayChange`` passes only when its value restates the stored one (as server-side
apply restates the whole object); a directive (``$patch``, ``$retainKeys``,
``$setElementOrder/<field>``, ``$deleteFromPrimitiveList/<field>``, any ``$`` key) passes only
inside a ``mayChange`` subtree. Anything else can change a field outside ``mayChange``, so the
patch is refused with the gatekeeper's own answer: nothing of it is asked of the apiserver, whose
dry run of such a patch may itself fail (kube-apiserver 1.36.3 panics on
``$setElementOrder/taints`` on a Node). Fields only the apiserver maintains are left to
:func:`~gatekeeper.policy.changes.maintained_change`.
"""

from __future__ import annotations

from typing import Any

from gatekeeper.codec.jsonpath import MISSING, FieldPath
from gatekeeper.policy.changes import MAINTAINED, dotted, first_difference, only_changes
from gatekeeper.policy.model import Changeable, KindRule
from gatekeeper.policy.plan import Plan
from gatekeeper.rule import Rule, Violation

__all__ = ["scope_violation"]

_OWN = frozenset({KindRule.OWN_NODE, KindRule.OWN_POD})


def scope_violation(plan: Plan, patch: Any, current: Any) -> Violation | None:
    """Why ``patch`` (a strategic-merge or apply patch of ``current``) can change a field its
    kind's ``mayChange`` does not name; None when it cannot, or for rules without ``mayChange``."""
    if plan.kind.rule not in _OWN or not isinstance(patch, dict):
        return None
    allowed = plan.version.may_change
    problem = _walk(patch, current, (), allowed)
    return Violation(Rule.MAY_CHANGE, f"{problem}: {only_changes(allowed)}") if problem else None


def _walk(
    patch: dict[str, Any], stored: Any, path: FieldPath, allowed: tuple[Changeable, ...]
) -> str | None:
    for key, value in patch.items():
        if key.startswith("$"):
            target = (*path, key.split("/", 1)[1]) if "/" in key else path
            if not _inside(target, allowed):
                return f"the directive {key} at {dotted(path)} can change {dotted(target)}"
            continue
        child = (*path, key)
        if child in MAINTAINED or _inside(child, allowed):
            continue
        was = stored.get(key, MISSING) if isinstance(stored, dict) else MISSING
        keyed = next((entry for entry in allowed if entry.path == child and entry.keys), None)
        if keyed is not None:
            problem = _keyed(value, was, keyed)
        elif isinstance(value, dict):
            problem = _walk(value, was, child, allowed)
        else:
            problem = None if _restates(value, was) else f"{dotted(child)} can change"
        if problem:
            return problem
    return None


def _keyed(value: Any, was: Any, entry: Changeable) -> str | None:
    """A map whose ``keys`` only may change (labels under a prefix)."""
    stored = was if isinstance(was, dict) else {}
    where = dotted(entry.path)
    if value is None:
        outside = sorted(key for key in stored if not entry.allows_key(key))
        return f"{where}: null removes {where}[{outside[0]}]" if outside else None
    if not isinstance(value, dict):
        return f"{where} is not a map"
    for key, item in value.items():
        if key.startswith("$"):
            return f"the directive {key} in {where} can change keys outside those allowed"
        if not entry.allows_key(key) and not _restates(item, stored.get(key, MISSING)):
            return f"{where}[{key}] can change"
    return None


def _restates(value: Any, stored: Any) -> bool:
    """Whether merging ``value`` over ``stored`` leaves it as it is."""
    if value is None:
        return stored is MISSING or stored is None
    if isinstance(value, dict):
        if not isinstance(stored, dict):
            return not value  # {} over nothing decodes to nothing
        return all(
            not key.startswith("$") and _restates(item, stored.get(key, MISSING))
            for key, item in value.items()
        )
    return stored is not MISSING and first_difference(stored, value, opaque=()) is None


def _inside(path: FieldPath, allowed: tuple[Changeable, ...]) -> bool:
    """``path`` is in a subtree that may change (a keyed entry's allowed key included)."""
    for entry in allowed:
        size = len(entry.path)
        if entry.keys:
            if len(path) > size and path[:size] == entry.path and entry.allows_key(path[size]):
                return True
        elif path[:size] == entry.path:
            return True
    return False
