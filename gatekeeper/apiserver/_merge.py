"""JSON merge patch as the apiserver applies it (evanphx/json-patch ``MergePatch``), pure.

The embedded API server's own implementation, written from that library's rules and checked
against recordings 159 and 182-185; it shares no code with the gatekeeper's. The rules:
an object in the patch merges into an object in the document key by key, a ``null`` deleting
the key; any other patch value replaces the document's. A replacing value has its ``null``
object members removed at every depth (inside lists too, list elements themselves are kept)
unless it replaces an object with a non-object, where it is kept as sent.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["merge_patch"]


def _prune_nulls(value: Any) -> Any:
    """``value`` without ``null`` object members at any depth (``pruneNulls``)."""
    if isinstance(value, dict):
        return {k: _prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_prune_nulls(v) for v in value]
    return value


def _merge_docs(doc: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
            continue
        current = out.get(key)
        if not isinstance(current, dict):  # absent, null or not an object
            out[key] = _prune_nulls(value)
        elif isinstance(value, dict):
            out[key] = _merge_docs(current, value)
        else:
            out[key] = copy.deepcopy(value)  # an object replaced by a non-object: as sent
    return out


def merge_patch(document: Any, patch: Any) -> Any:
    """The document ``patch`` turns ``document`` into (neither is modified)."""
    if not isinstance(patch, dict):
        return _prune_nulls(patch) if isinstance(patch, list) else copy.deepcopy(patch)
    if not isinstance(document, dict):
        return _prune_nulls(patch)
    return _merge_docs(document, patch)
