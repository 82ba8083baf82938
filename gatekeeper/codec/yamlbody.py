"""Apply-patch YAML read as JSON written in YAML: no anchors or aliases, no tags beyond JSON's
types, no more than :data:`~gatekeeper.codec.jsonbounds.MAX_BODY_DEPTH` levels — all refused from
the parser's events, before anything is built (an alias bomb never expands).

Objects are built from the events with an explicit stack (PyYAML's composer recurses per
level). Plain scalars resolve to null, bool, int, float or string only: a YAML date, ``<<``
merge key or ``=`` stays a string, so what is checked is plain JSON, and that is what is
forwarded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import yaml
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    NodeEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from yaml.nodes import ScalarNode

from gatekeeper.codec.jsonbounds import MAX_BODY_DEPTH

__all__ = ["YAMLBodyError", "load_json_yaml"]

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + name for name in ("null", "bool", "int", "float", "str"))
_MAP_TAG, _SEQ_TAG = _TAG + "map", _TAG + "seq"


class YAMLBodyError(ValueError):
    """A YAML body that is not JSON written in YAML; the message says what and where."""


class _JSONResolver(yaml.resolver.BaseResolver):
    """The YAML 1.1 resolvers of PyYAML's SafeLoader for JSON's scalar types only."""


for _tag, _regexp, _first in (
    (tag, regexp, first)
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
    for tag, regexp in resolvers
    if tag in _SCALAR_TAGS
):
    _JSONResolver.add_implicit_resolver(_tag, _regexp, [_first])


class _Loader(yaml.SafeLoader):
    """SafeLoader whose events are read by :func:`load_json_yaml`; it resolves JSON types."""

    yaml_implicit_resolvers = _JSONResolver.yaml_implicit_resolvers


def load_json_yaml(
    text: str,
    mapping: Callable[[list[tuple[str, Any]]], dict[str, Any]],
    *,
    max_depth: int = MAX_BODY_DEPTH,
) -> Any:
    """The one YAML document in ``text`` as JSON values; ``mapping`` builds each object from its
    key/value pairs (and may refuse them). Raises :class:`YAMLBodyError` or ``yaml.YAMLError``.
    """
    loader = _Loader(text)
    constructor = yaml.SafeLoader("")
    stack: list[tuple[list[Any], bool]] = []  # (items or flat key/value list, is mapping)
    documents = 0
    result: Any = None
    try:
        while loader.check_event():
            event = loader.get_event()  # type: ignore[no-untyped-call]
            if isinstance(event, DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise YAMLBodyError("request body has more than one YAML document")
            if not isinstance(event, NodeEvent | MappingEndEvent | SequenceEndEvent):
                continue
            _screen(event, len(stack), max_depth)
            if isinstance(event, MappingStartEvent | SequenceStartEvent):
                stack.append(([], isinstance(event, MappingStartEvent)))
                continue
            if isinstance(event, MappingEndEvent | SequenceEndEvent):
                items, is_map = stack.pop()
                value: Any = _pairs(items, mapping) if is_map else items
            else:
                assert isinstance(event, ScalarEvent)
                value = _scalar(loader, constructor, event)
            if stack:
                stack[-1][0].append(value)
            else:
                result = value
    finally:
        loader.dispose()
    return result


def _screen(event: Any, depth: int, max_depth: int) -> None:
    where = f"line {event.start_mark.line + 1}, column {event.start_mark.column + 1}"
    if isinstance(event, AliasEvent) or (isinstance(event, NodeEvent) and event.anchor is not None):
        # SECURITY: an alias can expand a few hundred bytes into gigabytes (a "billion laughs")
        # after the size check; JSON has no aliases, so none are accepted.
        raise YAMLBodyError(f"request body uses a YAML anchor or alias ({where}): not accepted")
    tag = event.tag if isinstance(event, CollectionStartEvent | ScalarEvent) else None
    if tag is not None and tag not in _SCALAR_TAGS | {_MAP_TAG, _SEQ_TAG, "!"}:
        raise YAMLBodyError(
            f"request body uses the YAML tag {tag} ({where}): only JSON's types are accepted"
        )
    if isinstance(event, MappingStartEvent | SequenceStartEvent) and depth >= max_depth:
        raise YAMLBodyError(
            f"request body is nested more than {max_depth} levels deep ({where}): "
            f"the gatekeeper accepts at most {max_depth}"
        )


def _scalar(loader: _Loader, constructor: yaml.SafeLoader, event: ScalarEvent) -> Any:
    if event.tag in (None, "!"):
        tag = loader.resolve(ScalarNode, event.value, event.implicit)  # type: ignore[no-untyped-call]
    else:
        tag = event.tag
    node = ScalarNode(tag, event.value, style=event.style)
    value = constructor.construct_object(node) if tag in _SCALAR_TAGS else event.value
    if isinstance(value, float) and not math.isfinite(value):
        raise YAMLBodyError(f"request body has the number {event.value!r}: not a finite double")
    return value


def _pairs(flat: list[Any], mapping: Callable[[list[tuple[str, Any]]], dict[str, Any]]) -> Any:
    keys, values = flat[0::2], flat[1::2]
    if not all(isinstance(key, str) for key in keys):
        raise YAMLBodyError("request body has a mapping key that is not a string")
    return mapping(list(zip(keys, values, strict=True)))
