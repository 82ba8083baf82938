"""Dotted field paths (``spec.pool.name``) into plain JSON dicts.

The embedded API server's own copy of the few functions it shares with
:mod:`gatekeeper.codec.jsonpath` (it imports nothing of the gatekeeper).
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = ["MISSING", "FieldPath", "get_field", "is_field_name", "parse_field_path"]

_SEGMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = _Missing()
"""Returned by :func:`get_field` when a path does not resolve to a value."""

FieldPath = tuple[str, ...]


def is_field_name(segment: str) -> bool:
    """Whether ``segment`` can be one step of a policy field path."""
    return _SEGMENT.match(segment) is not None


def parse_field_path(text: str) -> FieldPath:
    """``"spec.pool.name"`` → ``("spec", "pool", "name")``; ValueError on anything else."""
    if not isinstance(text, str) or not text:
        raise ValueError("a field path must be a non-empty string like spec.pool.name")
    parts = tuple(text.split("."))
    for part in parts:
        if not is_field_name(part):
            raise ValueError(
                f"bad field path {text!r}: segment {part!r} is not a plain field name "
                "(letters, digits, '_' or '-', not starting with a digit)"
            )
    return parts


def get_field(obj: Any, path: FieldPath) -> Any:
    """The value at ``path``, or :data:`MISSING` if any step is absent or not an object."""
    current = obj
    for key in path:
        if not isinstance(current, dict) or key not in current:
            return MISSING
        current = current[key]
    return current
