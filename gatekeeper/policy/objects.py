"""One object's verbs under every rule that owns whole objects: get, create, update, patch and
delete, checked against the rule's :class:`~gatekeeper.policy.plan.Ownership` and the kind's CEL,
and pinned to what was checked (DESIGN §4.3, §4.4)."""

from __future__ import annotations

from typing import Any

from gatekeeper.codec.jsonpath import get_field
from gatekeeper.policy.admission import DELETE, operation_of
from gatekeeper.policy.decision import Decision, allow, answered, forbid, not_found
from gatekeeper.policy.integrity import body_shape, pin_delete, pinned_update
from gatekeeper.policy.model import KindRule
from gatekeeper.policy.ownership import fill_missing
from gatekeeper.policy.patching import APPLY
from gatekeeper.policy.plan import Plan, Preview
from gatekeeper.policy.stored import maintained_refusal, predict, result_of
from gatekeeper.rule import Rule
from gatekeeper.types import KubeObject

__all__ = ["ANSWERED_FROM_READ", "decide_object"]

ANSWERED_FROM_READ = "stored object belongs to the driver on this node; answered from that read"
"""The reason of a plain-JSON get answered with the object the decision was made on."""

# The rules under which a driver creates objects (an apply of an absent one among them).
_CREATING = frozenset({KindRule.NODE_LOCAL, KindRule.DRIVER_NAMESPACE, KindRule.CEL})
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
    plan: Plan, body: Any, current: KubeObject | None, proposed: Preview | None
) -> Decision:
    """A request on one object of ``plan``'s kind: ``current`` is the stored object read at
    ``plan.fetch`` (None if absent), ``proposed`` a patch's preview with the upstream's answer."""
    info, kind = plan.info, plan.kind
    if info.verb == "create":
        return _write(plan, body, None)
    creating = kind.rule in _CREATING
    if current is None and info.verb == "patch" and plan.media_type == APPLY and creating:
        return _apply_create(plan, body)
    if current is None and plan.unread:
        return _write(plan, body, None)
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
        return _write(plan, body, current)
    if info.verb == "delete":
        if refusal := plan.context.refusal(plan.version.cel, DELETE, None, current):
            return refusal
        return pin_delete(info, kind, body, current, _reason(plan, read=True))
    return _patch(plan, body, current, proposed)


def _reason(plan: Plan, *, read: bool) -> str:
    read_reason, write_reason = _REASONS[plan.kind.rule]
    return read_reason if read else write_reason


def _get(plan: Plan, current: KubeObject) -> Decision:
    if plan.owner.hidden:
        # Forwarded, and its answer filtered again: the object may change in between.
        return allow(_reason(plan, read=True), plan.info, filter=_filter(plan))
    if plan.answer_from_fetch:
        # The object checked is the answer: a second read could return another object
        # (deleted and re-created by someone else in between) unchecked.
        return answered(ANSWERED_FROM_READ, 200, current)
    return allow(_reason(plan, read=True), plan.info)


def _filter(plan: Plan) -> Any:
    owner = plan.owner
    assert callable(owner), "a hidden ownership filters reads"
    return owner


def _write(plan: Plan, body: Any, current: KubeObject | None) -> Decision:
    """A create (``current`` None), or an update of ``current`` (of an object not read, for
    ``plan.unread``) with the object ``body``."""
    info, kind, version = plan.info, plan.kind, plan.version
    if refusal := body_shape(info, kind, body):
        return refusal
    assert isinstance(body, dict)
    # An update decided without a read (plan.unread) sets none of them (engine._unread_update).
    over = {} if current is None and plan.unread else current
    if not plan.decoded and (refusal := maintained_refusal(plan, body, over)):
        # SECURITY: DESIGN §4.4 — managedFields and the rest change only by the apiserver's
        # own bookkeeping (a decoded body's are the apiserver's: encoded.py).
        return refusal
    body = fill_missing(kind, version, body, plan.driver, plan.node_name)
    name = get_field(body, ("metadata", "name")) or None
    if problem := plan.owner.written(body, current):
        return forbid(plan.driver, info, problem, name=name if isinstance(name, str) else None)
    operation = "UPDATE" if plan.unread else operation_of(info.verb, current)
    if refusal := plan.context.refusal(version.cel, operation, body, current, scoped=_scoped(plan)):
        return refusal
    if current is not None:
        pinned = pinned_update(info, kind, body, current)
        if isinstance(pinned, Decision):
            return pinned
        body = pinned
    return allow(_reason(plan, read=False), info, body)


def _patch(plan: Plan, patch: Any, current: KubeObject, proposed: Preview | None) -> Decision:
    """A patch, decided on its one prediction (:mod:`gatekeeper.policy.stored`): the result
    computed here or the apiserver's dry run, as it chose."""
    info = plan.info
    stored = predict(plan, patch, current)
    if isinstance(stored, Decision):
        return stored
    result = result_of(stored, proposed, current)
    if isinstance(result, Decision):
        return result
    if refusal := body_shape(info, plan.kind, result):
        return refusal
    if problem := plan.owner.written(result, current):
        return forbid(plan.driver, info, problem.prefixed("after the patch, "))
    refusal = plan.context.refusal(
        plan.version.cel, operation_of("patch", current), result, current, scoped=_scoped(plan)
    )
    if refusal:
        return refusal
    return allow(_reason(plan, read=False), info, stored.pinned, plan.media_type)


def _scoped(plan: Plan) -> tuple[str, ...]:
    """Rule CEL: the object a write stores must stay in the caller's scope."""
    return ("object",) if plan.kind.rule is KindRule.CEL else ()


def _apply_create(plan: Plan, body: Any) -> Decision:
    # SECURITY: DESIGN §4.4 — the apiserver ignores a resourceVersion precondition when an
    # apply creates, so an apply could land on an object created after our check. Forwarding
    # it as a create (POST) makes that race fail with 409 AlreadyExists instead.
    decision = _write(plan, body, None)
    if not decision.allowed:
        return decision
    reason = "applied object is created for the driver on this node"
    if plan.version.owner_fields_immutable:
        # ... unless the apiserver itself refuses to change driver, node and pool of an
        # existing object (policy ``apiserverImmutable``; recordings 171-173): then an apply
        # landing on an object created in between fails there (409 conflict or 422
        # immutable), and forwarding the apply keeps its field ownership (Apply, not Update),
        # so the next apply with changed values succeeds, as it would without the gatekeeper.
        return allow(reason, plan.info, decision.body, APPLY)
    return allow(reason, plan.info.as_create(), decision.body)
