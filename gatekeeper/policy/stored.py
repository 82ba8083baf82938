"""What a write would store: the one prediction every rule decides on (DESIGN §4.4;
docs/security.md, "What the apiserver will store").

For a patch of a stored object one place chooses how its result is known, and the rules and CEL
read only that result:

- **computed here** for a JSON or merge patch whose result the gatekeeper reads exactly as the
  apiserver will store it: no CEL reads it (the structural rules read only fields whose decoding
  is modelled), and no null is left in it where the stored object has none — Go stores a null as
  its field's zero value (``""`` in a map of strings, nothing in a pointer, an empty struct in a
  list), and only the maps of meta/v1 ObjectMeta (labels, annotations: ``map[string]string`` in
  every kind) are typed without a schema, so their nulls are read as ``""`` here;
- **asked of the apiserver** (``dryRun=All``, :class:`~gatekeeper.policy.plan.Preview`) for a
  strategic-merge or apply patch (list merge keys, field ownership), and for a JSON or merge
  patch otherwise.

Before anything is asked, a patch is checked as far as it can be on its own: the apiserver's
bounds (:mod:`~gatekeeper.policy.jsonpatches`), the fields only the apiserver maintains
(:func:`~gatekeeper.policy.changes.maintained_change`), and for a kind with ``mayChange`` what
its keys and directives can change (:mod:`~gatekeeper.policy.patchscope`): such a patch is
refused before any dry run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gatekeeper.codec.jsonpath import MISSING
from gatekeeper.policy.changes import maintained_change
from gatekeeper.policy.decision import REJECTED_PREVIEW, Decision, answered, deny, forbid
from gatekeeper.policy.integrity import (
    body_shape,
    requested_resource_version,
    stale_conflict,
    stored_resource_version,
)
from gatekeeper.policy.jsonpatches import apply_json_patch
from gatekeeper.policy.patching import (
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
from gatekeeper.types import KubeObject

__all__ = ["Stored", "maintained_refusal", "patched_object", "predict", "result_of"]

_STRING_MAPS = ("labels", "annotations")


@dataclass(frozen=True, slots=True)
class Stored:
    """What a patch of the stored object would store, as known before the apiserver is asked."""

    pinned: Any
    """The patch with the resourceVersion precondition: what is forwarded (and previewed)."""
    local: KubeObject | None = None
    """The result computed here (a JSON or merge patch), whether or not it is decided on."""
    preview: Preview | None = None
    """The dry run whose answer is decided on; None when ``local`` is."""


def predict(plan: Plan, patch: Any, current: KubeObject) -> Decision | Stored:
    """How the result of ``patch`` on ``current`` (the caller's, checked) is known, or the
    refusal it gets before anything is asked of the apiserver."""
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


def result_of(stored: Stored, proposed: Preview | None, current: KubeObject) -> Decision | Any:
    """The result decided on: the local one, or the apiserver's answer to the dry run (its own
    refusal when it refused it). Without an answer (offline: ``audit check`` of a preview the
    log does not show), the local result, or a merge patch's for a strategic-merge or apply
    patch."""
    if stored.preview is None:
        return stored.local
    if proposed is not None and proposed.result is not None:
        if proposed.rejected:
            # The real patch would fail the same way: the driver gets the apiserver's answer.
            return answered(REJECTED_PREVIEW, proposed.code, proposed.result)
        return proposed.result
    if stored.local is not None:
        return stored.local
    try:
        return merge_patch(current, stored.pinned)
    except PatchError as exc:
        return deny(exc.code, str(exc))


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
    meta = result.get("metadata")
    if not isinstance(meta, dict):
        return result
    for name in _STRING_MAPS:
        values = meta.get(name)
        if isinstance(values, dict) and None in values.values():
            # meta/v1 ObjectMeta: map[string]string in every kind, and Go reads null as "".
            meta[name] = {key: "" if value is None else value for key, value in values.items()}
    return result


def maintained_refusal(plan: Plan, body: Any, current: KubeObject | None) -> Decision | None:
    """The refusal of a JSON create, update or apply that sets a field only the apiserver
    maintains (over ``current``; None for a create)."""
    if problem := maintained_change(body, current):
        return forbid(plan.driver, plan.info, problem)
    return None


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
    items by index, iteratively)."""
    pending = [(result, stored)]
    while pending:
        new, old = pending.pop()
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
