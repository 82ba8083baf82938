"""Patches, purely: the object a patch would store, and the patch pinned to what was checked.

DESIGN §4.4: decide on the result, then forward the client's patch with a resourceVersion
precondition so that it lands only on the object that was checked.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer

from gatekeeper.types import KubeObject

__all__ = [
    "APPLY",
    "JSON_PATCH",
    "MERGE_PATCH",
    "PATCH_TYPES",
    "STRATEGIC_MERGE",
    "PatchError",
    "merge_patch",
    "patched_object",
    "pin_patch",
]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = frozenset({MERGE_PATCH, JSON_PATCH, STRATEGIC_MERGE, APPLY})


class PatchError(ValueError):
    """The patch cannot be applied to the stored object (the apiserver answers 422)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def patched_object(media_type: str, current: KubeObject, patch: Any) -> KubeObject:
    """What the apiserver would store. Strategic merge and apply are approximated by a merge
    patch here; the proxy passes the upstream's ``dryRun=All`` answer instead when it has one."""
    if media_type == JSON_PATCH:
        if not isinstance(patch, list):
            raise PatchError("a JSON patch must be a list of operations")
        try:
            result = jsonpatch.apply_patch(current, patch)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise PatchError(f"the JSON patch does not apply: {exc}") from exc
        except (TypeError, KeyError, AttributeError) as exc:
            raise PatchError(f"the JSON patch is malformed: {exc}") from exc
    else:
        if not isinstance(patch, dict):
            raise PatchError(f"a {media_type} body must be an object")
        result = merge_patch(current, patch)
    if not isinstance(result, dict):
        raise PatchError("the patch does not leave an object")
    return result


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
