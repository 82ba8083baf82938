"""Patches, purely: their media types, the apiserver's merge patch, and the patch pinned to
what was checked (DESIGN §4.4: decide on the result, then forward the client's patch with a
resourceVersion precondition so that it lands only on the object that was checked). JSON
patches: :mod:`gatekeeper.policy.jsonpatches`; which result a patch is decided on:
:mod:`gatekeeper.policy.stored`."""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "APPLY",
    "BAD_MERGE_PATCH",
    "COMPUTED",
    "JSON_PATCH",
    "MERGE_PATCH",
    "PATCH_TYPES",
    "STRATEGIC_MERGE",
    "PatchError",
    "merge_patch",
    "pin_patch",
]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = frozenset({MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE, APPLY})
COMPUTED = frozenset({MERGE_PATCH, JSON_PATCH})
"""Patch types the gatekeeper can compute itself; the others need the apiserver's schema (list
merge keys, field ownership), so their result is always the apiserver's dry run."""


class PatchError(ValueError):
    """The patch cannot be applied to the stored object.

    ``code`` is the apiserver's answer: 422 when the patch does not apply, 400 when the patch
    document itself is not one the apiserver accepts (a merge patch that is not an object).
    """

    def __init__(self, message: str, code: int = 422) -> None:
        super().__init__(message)
        self.code = code


BAD_MERGE_PATCH = "Invalid JSON Patch"
"""The apiserver's 400 message for a merge patch that is not a JSON object."""


def merge_patch(target: Any, patch: Any) -> Any:
    """The apiserver's JSON merge patch (``MergePatch`` of evanphx/json-patch v4, which the
    apiserver applies to the stored object's JSON); PatchError (400) when ``patch`` is not an
    object.

    It is RFC 7386 with one difference that matters for what is stored: a value the patch
    puts in place, where the stored value is absent, null or not an object, is *pruned* —
    null-valued keys are removed from every object nested in it, at every depth, also inside
    lists (null list elements themselves stay). A list or scalar that replaces a stored
    object is kept as sent. Neither input is modified.
    """
    if not isinstance(patch, dict):
        raise PatchError(BAD_MERGE_PATCH, 400)
    if not isinstance(target, dict):
        return _pruned(patch)
    result = copy.deepcopy(target)
    _merge_into(result, patch)
    return result


def _merge_into(stored: dict[str, Any], patch: dict[str, Any]) -> None:
    """Merge ``patch`` into ``stored`` (a private copy) in place."""
    for key, value in patch.items():
        current = stored.get(key)
        if value is None:
            stored.pop(key, None)
        elif current is None or not isinstance(current, dict):
            # Absent, null, a list or a scalar: the patch's value replaces it, pruned.
            stored[key] = _pruned(value)
        elif not isinstance(value, dict):
            # A list or scalar replacing a stored object is taken as sent (not pruned).
            stored[key] = copy.deepcopy(value)
        else:
            _merge_into(current, value)


def _pruned(value: Any) -> Any:
    """``value`` without null-valued object keys, recursively (null list elements stay)."""
    if isinstance(value, dict):
        return {key: _pruned(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_pruned(item) for item in value]
    return value


def pin_patch(media_type: str, patch: Any, resource_version: str) -> Any:
    """The client's patch with a precondition on ``resource_version``."""
    if media_type == JSON_PATCH:
        test = {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}
        return [test, *patch]
    pinned = copy.deepcopy(patch)
    metadata = pinned.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        raise PatchError("metadata must be an object")
    metadata["resourceVersion"] = resource_version
    return pinned
