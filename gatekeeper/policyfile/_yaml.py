"""The one strict YAML loader of the gatekeeper's files (policies and policy tests): PyYAML's safe
loader, with the line of every key and list item, and refusals where YAML would guess.

- A key written twice in one mapping is refused (YAML keeps the last one silently).
- Merge keys (``<<: *anchor``) are read as YAML defines them: the mapping's own keys override
  the merged ones, and of several merged mappings the first that has a key gives it. That holds
  for both file kinds alike.
- A document that contains itself (``&a [*a]``), or that aliases expand past
  :data:`MAX_NODES` values, is refused before it is built: every later step walks the values.
- Values are JSON's: an unquoted date or time is text (as Kubernetes reads it); ``!!binary``,
  ``!!set``, ``!!omap``, ``!!pairs`` and ``!!timestamp`` are refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from gatekeeper.policy.draft import KeyPath

__all__ = [
    "MAX_NODES",
    "LineDict",
    "LineList",
    "Span",
    "YamlError",
    "line_at",
    "load_yaml",
    "plain",
    "position_at",
]

MAX_NODES = 200_000
"""Values a document may hold once its aliases are expanded (the largest shipped file, the
default policy's test file, holds about 16,000)."""
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlError(Exception):
    """Text that is not YAML the gatekeeper reads; ``line`` is 1-based, 0 if unknown."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


Span = tuple[int, int, str | None]
"""Where a string scalar was written: its first character's index in the text, the index after
its last, and its style (None plain, ``'``, ``"``, ``|``, ``>``)."""


class LineDict(dict[Any, Any]):
    """A mapping with the line it starts at, the line of each key and where each string value
    was written."""

    line: int = 0
    key_lines: dict[Any, int]
    value_spans: dict[Any, Span]

    def key_line(self, key: Any) -> int:
        """The line of ``key`` (the mapping's own line if the key is absent)."""
        return self.key_lines.get(key, self.line)


class LineList(list[Any]):
    """A list with the line it starts at, the line of each item and where each string item was
    written."""

    line: int = 0
    item_lines: list[int]
    item_spans: list[Span | None]


def line_at(doc: Any, path: KeyPath) -> int:
    """The line of the value at ``path`` in a loaded document: of its key or list item, or of
    the deepest step of ``path`` that exists (0 when none has a line)."""
    line = doc.line if isinstance(doc, LineDict | LineList) else 0
    node = doc
    for step in path:
        if isinstance(node, LineDict) and step in node:
            line, node = node.key_line(step), node[step]
        elif isinstance(node, LineList) and isinstance(step, int) and 0 <= step < len(node):
            line, node = node.item_lines[step], node[step]
        else:
            break
    return line


def position_at(text: str, doc: Any, path: KeyPath, offset: int) -> tuple[int, int]:
    """The 1-based line and column in ``text`` of the character at ``offset`` of the string at
    ``path`` in ``doc`` (loaded from ``text``): non-blank characters are written one for one in
    every style, so the one at ``offset`` is the same non-blank character of the written text
    (an escape or a doubled quote counts as one). The value's line and column 0 when it cannot
    tell (a value not written as a string here, an alias)."""
    parent: Any = doc
    for step in path[:-1]:
        listed = isinstance(parent, list) and isinstance(step, int) and 0 <= step < len(parent)
        parent = parent[step] if listed or (isinstance(parent, dict) and step in parent) else None
    span: Span | None = None
    if path and isinstance(parent, LineDict):
        span = parent.value_spans.get(path[-1])
    elif path and isinstance(parent, LineList) and isinstance(path[-1], int):
        span = parent.item_spans[path[-1]] if 0 <= path[-1] < len(parent) else None
    value = parent[path[-1]] if span is not None else None
    if span is None or not isinstance(value, str):
        return line_at(doc, path), 0
    index = _written_index(text, span, value, offset)
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


# What a double-quoted escape stands for, where that is blank (it is then not counted).
_BLANK_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", " ": " ", "\t": "\t", "L": "\u2028",
                  "P": "\u2029", "N": "\x85", "_": "\xa0"}  # fmt: skip
_ESCAPE_WIDTHS = {"x": 4, "u": 6, "U": 10}


def _written_index(text: str, span: Span, value: str, offset: int) -> int:
    start, end, style = span
    offset = max(0, min(offset, len(value)))
    while offset < len(value) and value[offset].isspace():
        offset += 1
    after = offset >= len(value)  # past the last character (the end of the expression)
    wanted = sum(1 for char in value[:offset] if not char.isspace()) - after
    if wanted < 0:
        return start
    if style in ("|", ">"):
        at = text.find("\n", start, end) + 1 or start  # after the header line
    else:
        at = start + 1 if style in ("'", '"') else start
    seen = 0
    while at < end:
        char = text[at]
        width = 1
        if char.isspace():
            at += 1
            continue
        if style == '"' and char == "\\" and at + 1 < end:
            escaped = text[at + 1]
            width = _ESCAPE_WIDTHS.get(escaped, 2)
            if escaped == "\n" or _BLANK_ESCAPES.get(escaped, "x").isspace():
                at += width
                continue
        elif style == "'" and char == "'" and text[at + 1 : at + 2] == "'":
            width = 2
        if seen == wanted:
            return at + width if after else at
        seen += 1
        at += width
    return start


_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# YAML types JSON has no value for: refused rather than turned into Python objects that no
# later step (the schema, a JSON body) can read.
_NOT_JSON_TAGS = (
    _TIMESTAMP_TAG,
    *(f"tag:yaml.org,2002:{t}" for t in ("binary", "set", "omap", "pairs")),
)


class _LineLoader(yaml.SafeLoader):
    # An unquoted date or time is text, as Kubernetes reads it (creationTimestamp: 2024-…Z).
    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP_TAG]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def _mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    written: set[Any] = set()
    for key_node, _ in node.value:  # the keys written here, before merges are expanded
        key = "<<" if key_node.tag == _MERGE_TAG else loader.construct_object(key_node, deep=True)
        try:
            if key in written:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            written.add(key)
        except TypeError:  # a list or mapping as a key
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a plain value", key_node.start_mark
            ) from None
    loader.flatten_mapping(node)  # merged keys first: the keys written here override them
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    out.value_spans = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
        out[key] = loader.construct_object(value_node, deep=True)
        if (span := _span(value_node)) is not None:
            out.value_spans[key] = span
    return out


def _span(node: yaml.Node) -> Span | None:
    if not isinstance(node, yaml.ScalarNode):
        return None
    return (node.start_mark.index, node.end_mark.index, node.style)


def _sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    out.item_spans = [_span(child) for child in node.value]
    return out


def _not_json(loader: _LineLoader, node: yaml.Node) -> Any:
    raise yaml.constructor.ConstructorError(
        None, None, f"{node.tag} has no JSON value (write it as a string)", node.start_mark
    )


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)
for _tag in _NOT_JSON_TAGS:
    _LineLoader.add_constructor(_tag, _not_json)


def _children(node: yaml.Node) -> Iterator[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key
            yield value
    elif isinstance(node, yaml.SequenceNode):
        yield from node.value


def _check_size(root: yaml.Node) -> None:
    """Refuse a document that contains itself or expands past MAX_NODES values (each node is
    counted once per place it appears; a shared node's count is computed once)."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, Iterator[yaml.Node]]] = [(root, _children(root))]
    open_nodes.add(id(root))
    while stack:
        node, children = stack[-1]
        child = next(children, None)
        if child is None:
            stack.pop()
            open_nodes.discard(id(node))
            total = 1 + sum(sizes[id(c)] for c in _children(node))
            if total > MAX_NODES:
                raise YamlError(
                    f"holds more than {MAX_NODES} values once its aliases are expanded",
                    node.start_mark.line + 1,
                )
            sizes[id(node)] = total
        elif id(child) in open_nodes:
            line = node.start_mark.line + 1
            raise YamlError("a value contains itself (a recursive alias)", line)
        elif id(child) not in sizes:
            open_nodes.add(id(child))
            stack.append((child, _children(child)))


def load_yaml(text: str) -> Any:
    """One YAML document, with :class:`LineDict`/:class:`LineList` for mappings and lists;
    YamlError naming the line on any fault (None for an empty document)."""
    loader = _LineLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise YamlError(f"not valid YAML: {problem}", mark.line + 1 if mark else 0) from exc
    except yaml.YAMLError as exc:
        raise YamlError(f"not valid YAML: {' '.join(str(exc).split())}", 0) from exc
    finally:
        loader.dispose()


def plain(value: Any) -> Any:
    """``value`` with plain dicts and lists (for objects sent over the wire)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
