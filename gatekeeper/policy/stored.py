"""What a write would store: the one prediction every rule decides on (DESIGN §4.4;
docs/security.md, "What the apiserver will store").

For every write one place, :func:`predict`, chooses how what it stores is known, and the rules
and CEL read only that (:func:`result_of`); the conversation computes it once and hands it to
the engine's decision:

- **computed here** for a JSON or merge patch, and for a JSON create or update body, that the
  gatekeeper reads exactly as the apiserver will store it: no CEL reads a patch's result (the
  structural rules read only fields whose decoding is modelled), and no null is left in it where
  the stored object has none — Go stores a null as its field's zero value (``""`` in a map of
  strings, nothing in a pointer, an empty struct in a list), and only the maps of meta/v1
  ObjectMeta (labels, annotations: ``map[string]string`` in every kind) are typed without a
  schema, so their nulls are read as ``""`` here; the fields the apiserver maintains itself
  (:data:`~gatekeeper.policy.changes.MAINTAINED`) are not read (client-go's JSON sends
  ``metadata.creationTimestamp: null`` in every create);
- **asked of the apiserver** (``dryRun=All``, :class:`~gatekeeper.policy.plan.Preview`) for a
  strategic-merge or apply patch (list merge keys, field ownership), a JSON or merge patch
  otherwise, a body with a null it may store otherwise, and a body only it decodes (protobuf,
  CBOR: :mod:`~gatekeeper.policy.encoded`). The same pinned patch or body is then forwarded.

Before anything is asked, a write is checked as far as it can be on its own: the apiserver's
bounds (:mod:`~gatekeeper.policy.jsonpatches`), the fields only the apiserver maintains
(:func:`~gatekeeper.policy.changes.maintained_change`), for a kind with ``mayChange`` what a
patch's keys and directives can change (:mod:`~gatekeeper.policy.patchscope`), and whether the
object it would store is the caller's: what fails is refused before any dry run. Nothing is
asked about an object the caller may not touch, nor for a kind forwarded under the driver's own
credentials (DESIGN §4.3a).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gatekeeper.codec import jsoncodec
from gatekeeper.codec.jsonpath import MISSING, get_field
from gatekeeper.policy.changes import MAINTAINED, maintained_change
from gatekeeper.policy.decision import Decision, answered, deny, forbid, rejected_preview
from gatekeeper.policy.encoded import encoded_preview
from gatekeeper.policy.integrity import (
    body_shape,
    pinned_update,
    requested_resource_version,
    stale_conflict,
    stored_resource_version,
)
from gatekeeper.policy.jsonpatches import apply_json_patch
from gatekeeper.policy.model import KindRule
from gatekeeper.policy.ownership import fill_missing
from gatekeeper.policy.patching import (
    APPLY,
    BAD_MERGE_PATCH,
    COMPUTED,
    JSON_PATCH,
    MERGE_PATCH,
    PatchError,
    merge_patch,
    pin_patch,
)
from gatekeeper.policy.patchscope import scope_violation
from gatekeeper.policy.plan import Plan, Preview
from gatekeeper.request.encoded import EncodedBody
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import KubeObject

__all__ = [
    "CREATING",
    "Stored",
    "apply_create_target",
    "holds_null",
    "object_name",
    "patched_object",
    "predict",
    "result_of",
]

CREATING = frozenset({KindRule.NODE_LOCAL, KindRule.DRIVER_NAMESPACE, KindRule.CEL})
"""The rules under which a driver creates objects (an apply of an absent one among them)."""

_JSON = "application/json"
_STRING_MAPS = ("labels", "annotations")
_MAINTAINED_META = frozenset(path[1] for path in MAINTAINED if path[0] == "metadata")
_NULL_MARKS = (b":null", b",null", b"[null")


@dataclass(frozen=True, slots=True)
class Stored:
    """What a write would store, as known before the apiserver is asked: the conversation's one
    prediction (:func:`predict`), which the engine decides on."""

    pinned: Any
    """What is forwarded (and previewed): the patch with the resourceVersion precondition, the
    body (filled, pinned to the stored object), or the driver's encoded bytes."""
    local: KubeObject | None = None
    """The object computed here (as Go reads it), whether or not it is decided on; None for a
    strategic-merge or apply patch and an encoded body."""
    preview: Preview | None = None
    """The dry run whose answer is decided on, once asked with its answer; None when ``local``
    is decided on."""

    def answered(self, preview: Preview) -> Stored:
        """This prediction with its dry run answered (``preview`` carries the answer)."""
        return replace(self, preview=preview)


def predict(plan: Plan, body: Any, current: KubeObject | None) -> Decision | Stored | None:
    """How what ``body`` would store is known (over ``current``, the stored object read for
    ``plan``), or the refusal it gets before anything is asked of the apiserver; None when the
    engine decides without one: a kind forwarded under the driver's own credentials, a request
    that stores nothing, an object absent or not the caller's (refused without asking)."""
    if plan.kind.rule is KindRule.DRIVER_CREDENTIALS:
        return None
    verb = plan.info.verb
    if isinstance(body, EncodedBody):
        preview = encoded_preview(plan, body, current)
        return None if preview is None else Stored(preview.body, None, preview)
    if verb == "patch":
        if current is None:
            if plan.media_type == APPLY and plan.kind.rule in CREATING:
                # An apply of an absent object creates it: its body is what is written.
                return _written(plan, body, None, apply_create_target(plan))
            return None
        return _patched(plan, body, current) if plan.owns(current) else None
    if verb == "create":
        return _written(plan, body, None, (plan.info, _JSON))
    if verb != "update":
        return None
    if current is None and not plan.unread:
        return None
    if current is not None and not plan.owns(current):
        return None
    return _written(plan, body, current, (plan.info, _JSON))


def result_of(stored: Stored, current: KubeObject | None) -> Decision | Any:
    """The object decided on: the local one, or the apiserver's answer to the dry run (its own
    refusal when it refused it). Without an answer (offline: ``audit check`` of a preview the
    log does not show), the local object, or a merge patch's result for a strategic-merge or
    apply patch."""
    preview = stored.preview
    if preview is None:
        return stored.local
    if preview.result is not None:
        if preview.rejected:
            # The real write would fail the same way: the driver gets the apiserver's answer.
            reason = rejected_preview(preview.target.verb)
            return answered(reason, preview.code, preview.result)
        return preview.result
    if stored.local is not None:
        return stored.local
    try:
        return merge_patch(current, stored.pinned)
    except PatchError as exc:
        return deny(exc.code, str(exc))


def apply_create_target(plan: Plan) -> tuple[RequestInfo, str]:
    """What an apply of an absent object is forwarded as: the apply itself, where the apiserver
    refuses to change the object's owner fields (``apiserverImmutable``), else a create.

    SECURITY: DESIGN §4.4 — the apiserver ignores a resourceVersion precondition when an apply
    creates, so an apply could land on an object created after the check; forwarded as a create
    (POST), that race fails with 409 AlreadyExists instead. Where the apiserver itself refuses
    to change driver, node and pool of an existing object (policy ``apiserverImmutable``;
    recordings 171-173), an apply landing on an object created in between fails there (409
    conflict or 422 immutable), and forwarding the apply keeps its field ownership (Apply, not
    Update), so the next apply with changed values succeeds, as it would without the
    gatekeeper."""
    if plan.version.owner_fields_immutable:
        return plan.info, APPLY
    return plan.info.as_create(), _JSON


def holds_null(body: Any) -> bool:
    """Whether a create or update body holds a null the apiserver may store otherwise than it
    reads (outside labels, annotations and the fields the apiserver maintains)."""
    return isinstance(body, dict) and _new_null(_as_go_reads(body), None)


def patched_object(media_type: str, current: KubeObject, patch: Any) -> KubeObject:
    """What a JSON or merge patch would store, as the apiserver computes it (labels and
    annotations as Go reads them: a null is ``""``); PatchError when it does not apply."""
    result = (
        apply_json_patch(current, patch)
        if media_type == JSON_PATCH
        else merge_patch(current, patch)
    )
    if not isinstance(result, dict):
        raise PatchError("the patch does not leave an object")
    return _as_go_reads(result)


def object_name(obj: Any) -> str | None:
    """The object's ``metadata.name``, as a refusal names it (None when it has none)."""
    name = get_field(obj, ("metadata", "name"))
    return name if isinstance(name, str) and name else None


def _patched(plan: Plan, patch: Any, current: KubeObject) -> Decision | Stored:
    """A patch of ``current``, the caller's."""
    info, kind = plan.info, plan.kind
    stored_rv = stored_resource_version(current)
    if conflict := stale_conflict(info, kind, requested_resource_version(patch), stored_rv):
        return conflict
    computed = plan.media_type in COMPUTED
    try:
        _check_shape(plan.media_type, patch)
        # The pinned patch is what is forwarded, so it is what is computed (its test passes).
        pinned = pin_patch(plan.media_type, patch, stored_rv)
        local = patched_object(plan.media_type, current, pinned) if computed else None
    except PatchError as exc:
        return _patch_refusal(plan, exc)
    if local is None:
        if problem := maintained_change(patch, current) or scope_violation(plan, patch, current):
            return forbid(plan.driver, info, problem)
        return Stored(pinned, None, Preview(info, pinned, plan.media_type))
    if conflict := stale_conflict(info, kind, requested_resource_version(local), stored_rv):
        # A JSON patch may set the resourceVersion after its pin: the write would be asked
        # on a version the gatekeeper never checked (a number: 409; anything else: 500).
        return conflict
    if problem := maintained_change(local, current):
        return forbid(plan.driver, info, problem.prefixed("after the patch, "))
    if refusal := body_shape(info, kind, local):
        return refusal
    if not plan.version.cel and not _new_null(local, current):
        return Stored(pinned, local)
    # SECURITY: docs/security.md "What the apiserver will store" — decided on the apiserver's
    # own result; what the local result already refuses is refused before it is asked.
    if problem := plan.owner.written(local, current):
        return forbid(plan.driver, info, problem.prefixed("after the patch, "))
    return Stored(pinned, local, Preview(info, pinned, plan.media_type))


def _written(
    plan: Plan, body: Any, current: KubeObject | None, target: tuple[RequestInfo, str]
) -> Decision | Stored:
    """A create, an apply that creates, or an update of ``current`` (of an object not read, for
    ``plan.unread``), with the object ``body``; ``target`` is what a dry run of it is sent as."""
    info, kind, version = plan.info, plan.kind, plan.version
    if refusal := body_shape(info, kind, body):
        return refusal
    # An update decided without a read (plan.unread) sets none of them (engine._unread_update).
    over = {} if current is None and plan.unread else current
    if not plan.decoded and (problem := maintained_change(body, over)):
        # SECURITY: DESIGN §4.4 — managedFields and the rest change only by the apiserver's
        # own bookkeeping (a decoded body's are the apiserver's: encoded.py).
        return forbid(plan.driver, info, problem)
    filled = fill_missing(kind, version, body, plan.driver, plan.node_name)
    pinned: Any = filled
    if current is not None:
        pinned = pinned_update(info, kind, filled, current)
        if isinstance(pinned, Decision):
            return pinned
    local = _as_go_reads(filled)
    # A decoded body is the apiserver's own JSON: its nulls are what it stores. An update
    # decided without a read holds none (engine._unread_update reads first where it does).
    if plan.decoded or plan.unread or not _new_null(local, current):
        return Stored(pinned, local)
    # SECURITY: docs/security.md "What the apiserver will store" — a null the apiserver may
    # store as its field's zero value (or leave out): decided on its dry run of this body. What
    # the local object already refuses, or an object not the caller's, is refused first.
    if problem := plan.owner.written(local, current):
        return forbid(plan.driver, info, problem, name=object_name(local))
    if current is None and (refusal := _out_of_scope(plan, local)):
        return refusal
    sent_as, media_type = target
    return Stored(pinned, local, Preview(sent_as, pinned, media_type))


def _out_of_scope(plan: Plan, local: KubeObject) -> Decision | None:
    """Rule CEL: the refusal of an object to create that is not in the caller's scope, by the
    scope alone (its validations are read on what the apiserver stores)."""
    cel = plan.version.cel
    if plan.kind.rule is not KindRule.CEL or cel.scope is None:
        return None
    scope_only = replace(cel, validations=())
    return plan.context.refusal(scope_only, "CREATE", local, None, scoped=("object",))


def _as_go_reads(obj: KubeObject) -> KubeObject:
    """``obj`` with its labels and annotations as Go reads them: meta/v1 ObjectMeta's
    ``map[string]string`` in every kind, where a null is ``""`` (the key stored). A copy where
    one changes; ``obj`` itself otherwise."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    read = meta
    for name in _STRING_MAPS:
        values = meta.get(name)
        if isinstance(values, dict) and None in values.values():
            if read is meta:
                read = dict(meta)
            read[name] = {key: "" if value is None else value for key, value in values.items()}
    return obj if read is meta else {**obj, "metadata": read}


def _check_shape(media_type: str, patch: Any) -> None:
    """400, as the apiserver answers, for a patch document of the wrong shape."""
    if media_type == JSON_PATCH and not isinstance(patch, list):
        raise PatchError(
            "json: cannot unmarshal the body into Go value of type jsonpatch.Patch", 400
        )
    if media_type == MERGE_PATCH and not isinstance(patch, dict):
        raise PatchError(BAD_MERGE_PATCH, 400)
    if media_type != JSON_PATCH and not isinstance(patch, dict):
        raise PatchError(f"a {media_type} body must be an object", 400)


def _patch_refusal(plan: Plan, exc: PatchError) -> Decision:
    if exc.code != 422:
        return deny(exc.code, str(exc))
    return deny(422, str(exc), f'{plan.kind.qualified} "{plan.info.name}" is invalid: {exc}')


def _new_null(result: Any, stored: Any) -> bool:
    """Whether ``result`` holds a null where ``stored`` holds none (walked side by side, list
    items by index, iteratively), outside the fields only the apiserver maintains (what it
    stores there is its own whatever a write says: :data:`~gatekeeper.policy.changes.MAINTAINED`).
    """
    meta = result.get("metadata") if isinstance(result, dict) else None
    if isinstance(meta, dict) and meta.keys() & _MAINTAINED_META:
        kept = {key: value for key, value in meta.items() if key not in _MAINTAINED_META}
        result = {**result, "metadata": kept}
    try:
        # Most objects hold no null at all: orjson's compact bytes (in C, ~3 µs for 2 KB) say
        # so without the walk. A null value follows ":", "," or "["; a string holding one of
        # those before "null" only costs the walk.
        text = jsoncodec.dumps(result)
        if not any(mark in text for mark in _NULL_MARKS):
            return False
    except (RecursionError, ValueError):
        pass
    pending = [(result, stored)]
    while pending:
        new, old = pending.pop()
        if new is old:
            continue  # shared with the stored object: nothing new below
        if isinstance(new, dict):
            keyed = old if isinstance(old, dict) else {}
            pairs: Any = ((value, keyed.get(key, MISSING)) for key, value in new.items())
        elif isinstance(new, list):
            items = old if isinstance(old, list) else []
            pairs = (
                (value, items[i] if i < len(items) else MISSING) for i, value in enumerate(new)
            )
        else:
            continue
        for value, was in pairs:
            if value is None and was is not None:
                return True
            if isinstance(value, dict | list):
                pending.append((value, was))
    return False
