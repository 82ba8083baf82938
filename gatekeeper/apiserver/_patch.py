"""Patch bodies, parsed and applied as the apiserver does (pure; no I/O).

JSON merge patches follow the apiserver's library (``_merge``). Deliberate differences: a
strategic merge patch is applied as a JSON merge patch (lists are replaced, not merged by key;
``$patch`` directives are not interpreted). Server-side apply is done by ``_managed``.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import jsonpatch
import yaml

from gatekeeper.apiserver._errors import (
    APIError,
    bad_request,
    generic_invalid,
    unsupported_media_type,
)
from gatekeeper.apiserver._json import deep, loads
from gatekeeper.apiserver._merge import merge_patch
from gatekeeper.apiserver._types import KubeObject

__all__ = [
    "APPLY",
    "JSON_PATCH",
    "MERGE",
    "PATCH_TYPES",
    "STRATEGIC",
    "apply_patch",
    "merge_patch",
    "parse_patch",
]

MERGE: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC: Final = "application/strategic-merge-patch+json"
APPLY: Final = "application/apply-patch+yaml"
PATCH_TYPES: Final = (JSON_PATCH, MERGE, STRATEGIC, APPLY)


def parse_patch(content_type: str, body: bytes) -> tuple[str, Any]:
    """``(patch type, decoded patch)``; 415 for another content type, 400 for a bad body."""
    patch_type = content_type.split(";", 1)[0].strip().lower()
    if patch_type not in PATCH_TYPES:
        raise unsupported_media_type()
    if patch_type == APPLY:
        try:
            doc = yaml.safe_load(body.decode("utf-8")) if body.strip() else None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise bad_request(f"error decoding YAML: {exc}") from exc
        if not isinstance(doc, dict):
            raise bad_request("error decoding YAML: the apply configuration must be an object")
        return patch_type, doc
    try:
        doc = loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"error decoding patch: {exc}") from exc
    if patch_type == JSON_PATCH:
        if not isinstance(doc, list) or not all(isinstance(op, dict) for op in doc):
            raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    elif not isinstance(doc, dict):
        raise bad_request("json: cannot unmarshal the patch into an object")
    return patch_type, doc


def apply_patch(patch_type: str, patch: Any, current: KubeObject) -> KubeObject:
    """The object ``patch`` turns ``current`` into; 422 when a JSON patch cannot apply."""
    if patch_type == JSON_PATCH:
        try:
            result = deep(jsonpatch.JsonPatch(patch).apply, deep(copy.deepcopy, current))
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise generic_invalid() from exc
        except (TypeError, KeyError, IndexError, ValueError) as exc:
            raise generic_invalid() from exc
    else:
        result = deep(merge_patch, current, patch)
    if not isinstance(result, dict):
        raise APIError(generic_invalid().body)
    return result
