"""One object's verbs under every rule that owns whole objects: get, create, update, patch and
delete, checked against the rule's :class:`~gatekeeper.policy.plan.Ownership` and the kind's CEL,
and pinned to what was checked (DESIGN §4.3, §4.4)."""

from __future__ import annotations

from typing import Any

from gatekeeper.policy.admission import DELETE, operation_of
from gatekeeper.policy.decision import Decision, allow, answered, deny, forbid, not_found
from gatekeeper.policy.integrity import body_shape, pin_delete
from gatekeeper.policy.model import KindRule
from gatekeeper.policy.patching import APPLY
from gatekeeper.policy.plan import Plan
from gatekeeper.policy.stored import (
    CREATING,
    Stored,
    apply_create_target,
    object_name,
    predict,
    result_of,
)
from gatekeeper.rule import Rule
from gatekeeper.types import KubeObject

__all__ = ["ANSWERED_FROM_READ", "decide_object"]

ANSWERED_FROM_READ = "stored object belongs to the driver on this node; answered from that read"
"""The reason of a plain-JSON get answered with the object the decision was made on."""

# What an allowed request's audit reason says, by rule: (read, write).
_REASONS = {
    KindRule.NODE_LOCAL: (
        "stored object belongs to the driver on this node",
        "object belongs to the driver on this node",
    ),
    KindRule.ALLOCATED_TO_DRIVER: (
        "allocated to the driver on this node",
        "only the driver's own status entries change",
    ),
    KindRule.ON_NODE: ("object is on this node", "object is on this node"),
    KindRule.OWN_NODE: ("this node's own object", "only what mayChange names changes"),
    KindRule.OWN_POD: ("the caller's own pod", "only what mayChange names changes"),
    KindRule.DRIVER_NAMESPACE: (
        "object is in the driver's namespace",
        "object is in the driver's namespace",
    ),
    KindRule.CEL: ("object is in the driver's CEL scope", "object is in the driver's CEL scope"),
}


def decide_object(
    plan: Plan, body: Any, current: KubeObject | None, stored: Stored | None
) -> Decision:
    """A request on one object of ``plan``'s kind: ``current`` is the stored object read at
    ``plan.fetch`` (None if absent), ``stored`` the write's prediction
    (:func:`~gatekeeper.policy.stored.predict`, with the dry run's answer when it asked one;
    made here for a caller that has none)."""
    info, kind = plan.info, plan.kind
    if info.verb == "create":
        return _write(plan, body, None, stored)
    creating = kind.rule in CREATING
    if current is None and info.verb == "patch" and plan.media_type == APPLY and creating:
        return _apply_create(plan, body, stored)
    if current is None and plan.unread:
        return _write(plan, body, None, stored)
    if current is None:
        return not_found(info, kind.qualified)
    if problem := plan.owner.stored(current):
        if plan.owner.hidden:
            # SECURITY: DESIGN §4.3 — an object out of scope answers as absent (the same
            # Status), so that a driver cannot learn which others exist.
            return not_found(info, kind.qualified, problem.message, Rule.NOT_IN_SCOPE)
        return forbid(plan.driver, info, problem)
    if info.verb == "get":
        return _get(plan, current)
    if info.verb == "update":
        return _write(plan, body, current, stored)
    if info.verb == "delete":
        if refusal := plan.context.refusal(plan.version.cel, DELETE, None, current):
            return refusal
        return pin_delete(info, kind, body, current, _reason(plan, read=True))
    return _patch(plan, body, current, stored)


def _reason(plan: Plan, *, read: bool) -> str:
    read_reason, write_reason = _REASONS[plan.kind.rule]
    return read_reason if read else write_reason


def _get(plan: Plan, current: KubeObject) -> Decision:
    if plan.answer_from_fetch:
        # The object checked is the answer: a second read could return another object
        # (deleted and re-created by someone else in between) unchecked, and costs the
        # apiserver a request.
        return answered(ANSWERED_FROM_READ, 200, current)
    if plan.owner.hidden:
        # Forwarded, and its answer filtered again: the object may change in between.
        return allow(_reason(plan, read=True), plan.info, filter=_filter(plan))
    return allow(_reason(plan, read=True), plan.info)


def _filter(plan: Plan) -> Any:
    owner = plan.owner
    assert callable(owner), "a hidden ownership filters reads"
    return owner


def _write(plan: Plan, body: Any, current: KubeObject | None, stored: Stored | None) -> Decision:
    """A create (``current`` None), or an update of ``current`` (of an object not read, for
    ``plan.unread``), decided on what it stores."""
    known = _prediction(plan, body, current, stored)
    if isinstance(known, Decision):
        return known
    operation = "UPDATE" if plan.unread else operation_of(plan.info.verb, current)
    refusal = _refusal(plan, known, current, operation, name=object_name(known.pinned))
    return refusal or allow(_reason(plan, read=False), plan.info, known.pinned)


def _patch(plan: Plan, patch: Any, current: KubeObject, stored: Stored | None) -> Decision:
    """A patch, decided on its one prediction (:mod:`gatekeeper.policy.stored`): the result
    computed here or the apiserver's dry run, as it chose."""
    known = _prediction(plan, patch, current, stored)
    if isinstance(known, Decision):
        return known
    operation = operation_of("patch", current)
    refusal = _refusal(plan, known, current, operation, prefix="after the patch, ")
    return refusal or allow(_reason(plan, read=False), plan.info, known.pinned, plan.media_type)


def _refusal(
    plan: Plan, known: Stored, current: KubeObject | None, operation: str, *, prefix: str = "",
    name: str | None = None,
) -> Decision | None:  # fmt: skip
    """The refusal of what the write stores (the object its prediction decides on); None when
    the rules and CEL let it be stored."""
    result = result_of(known, current)
    if isinstance(result, Decision):
        if known.preview is not None and known.preview.rejected and known.local is not None:
            # The apiserver refused the dry run, so the write fails whatever is decided here.
            # Where the gatekeeper's own rules refuse the object read here too, that refusal
            # is the answer (its rule and validation reach the audit), else the apiserver's.
            return _object_refusal(plan, known.local, current, operation, prefix, name) or result
        return result
    # The shape of a body read here was checked with its prediction (stored._written).
    checked = known.preview is None and plan.info.verb != "patch"
    if not checked and (refusal := body_shape(plan.info, plan.kind, result)):
        return refusal
    return _object_refusal(plan, result, current, operation, prefix, name)


def _object_refusal(
    plan: Plan, obj: Any, current: KubeObject | None, operation: str, prefix: str,
    name: str | None,
) -> Decision | None:  # fmt: skip
    """Whose ``obj`` is, then the kind's CEL, on ``obj`` stored over ``current``."""
    if problem := plan.owner.written(obj, current):
        return forbid(plan.driver, plan.info, problem.prefixed(prefix), name=name)
    cel = plan.version.cel
    return plan.context.refusal(cel, operation, obj, current, scoped=_scoped(plan))


def _prediction(
    plan: Plan, body: Any, current: KubeObject | None, stored: Stored | None
) -> Decision | Stored:
    """The conversation's prediction, or (a caller that made none) the one made here."""
    known = stored if stored is not None else predict(plan, body, current)
    if known is None:
        # predict makes one for every write decide_object reaches: fail closed if not.
        return deny(500, "no prediction of what the write stores")
    return known


def _scoped(plan: Plan) -> tuple[str, ...]:
    """Rule CEL: the object a write stores must stay in the caller's scope."""
    return ("object",) if plan.kind.rule is KindRule.CEL else ()


def _apply_create(plan: Plan, body: Any, stored: Stored | None) -> Decision:
    # SECURITY: DESIGN §4.4 — an apply of an absent object is forwarded as a create, or as
    # the apply where the apiserver refuses to change its owner fields (apply_create_target).
    decision = _write(plan, body, None, stored)
    if not decision.allowed or not decision.forwards:
        return decision
    target, media_type = apply_create_target(plan)
    reason = "applied object is created for the driver on this node"
    return allow(reason, target, decision.body, media_type)
