"""CEL for the admission-policy export: ``metadata.managedFields`` changes only as the apiserver
records a write (docs/admission-policy.md, "Fields only the apiserver maintains").

The apiserver's bookkeeping of one write touches one entry, the writer's (its manager, operation
and subresource, with a new ``time``), and takes from the other entries the fields the write took
over: they keep their manager, operation, apiVersion, subresource and time, and their
``fieldsV1`` only loses fields. A create has no entry but the writer's. Anything else is an
entry forged by the write's body. The subset check walks :data:`FIELDS_DEPTH` levels of
``fieldsV1`` and compares deeper levels whole (CEL has no recursion).
"""

from __future__ import annotations

__all__ = ["FIELDS_DEPTH", "managed_fields_expression"]

FIELDS_DEPTH = 6
"""Levels of ``fieldsV1`` checked key by key (``f:status`` / ``f:devices`` / ``k:{…}`` /
``f:conditions`` / ``k:{…}`` / ``f:status``); below, a subtree that changed is refused."""

_NEW = "object.metadata.?managedFields.orValue([])"
_OLD = "oldObject.metadata.?managedFields.orValue([])"
_SAME = ("manager", "operation", "apiVersion", "subresource", "time")


def managed_fields_expression() -> str:
    """The validation: a create writes at most one entry; an update keeps every entry but at
    most one as stored, save for fields it took over."""
    kept = " && ".join(f"o.?{name}.orValue('') == e.?{name}.orValue('')" for name in _SAME)
    fewer = _subset("e.?fieldsV1.orValue({})", "o.?fieldsV1.orValue({})", FIELDS_DEPTH)
    return (
        "request.operation == 'DELETE' || (request.operation == 'CREATE' ? "
        f"size({_NEW}) <= 1 : "
        f"{_NEW}.filter(e, !{_OLD}.exists(o, {kept} && {fewer})).size() <= 1)"
    )


def _subset(new: str, old: str, depth: int) -> str:
    """``new`` holds no key ``old`` does not, ``depth`` levels down, and equal subtrees below."""
    if depth == 0:
        return f"{new} == {old}"
    key = f"__f{depth}"
    inner = _subset(f"{new}[{key}]", f"{old}[{key}]", depth - 1)
    return f"{new}.all({key}, {key} in {old} && {inner})"
