"""The fields of a logged object that a policy can name: string leaves outside ``status`` (of
``metadata``, only ``metadata.name``), by dotted path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gatekeeper.codec.jsonpath import FieldPath, is_field_name

__all__ = ["fields_holding", "leaf_paths"]

_NAME: FieldPath = ("metadata", "name")


def leaf_paths(obj: Any, prefix: FieldPath = ()) -> Iterator[FieldPath]:
    """Paths of the string fields of ``obj`` a policy can name."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(key, str) and is_field_name(key) and (*prefix, key)[:1] != ("status",):
                yield from leaf_paths(value, (*prefix, key))
    elif isinstance(obj, str) and prefix and (prefix[0] != "metadata" or prefix == _NAME):
        yield prefix


def fields_holding(obj: Any, value: str) -> frozenset[FieldPath]:
    """The fields of ``obj`` a policy can name that hold ``value``."""
    found = set()
    for path in leaf_paths(obj):
        current = obj
        for step in path:
            current = current[step]
        if current == value:
            found.add(path)
    return frozenset(found)
