"""YAML loading that remembers where each mapping, list and key came from (1-based lines).

Test files are checked with messages naming the line, so a CI annotation can point at it. The
loader is PyYAML's safe loader; it also refuses duplicate keys, which YAML silently collapses.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["LineDict", "LineList", "YamlError", "line_of", "load_yaml", "plain"]


class YamlError(Exception):
    """Text that is not YAML (or has a duplicate key); ``line`` is 1-based, 0 if unknown."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class LineDict(dict[Any, Any]):
    """A mapping with the line it starts at and the line of each key."""

    line: int = 0
    key_lines: dict[Any, int]

    def key_line(self, key: Any) -> int:
        """The line of ``key`` (the mapping's own line if the key is absent)."""
        return self.key_lines.get(key, self.line)


class LineList(list[Any]):
    """A list with the line it starts at and the line of each item."""

    line: int = 0
    item_lines: list[int]


def line_of(value: Any, default: int = 0) -> int:
    """The line a loaded mapping or list starts at, else ``default``."""
    return value.line if isinstance(value, LineDict | LineList) else default


class _LineLoader(yaml.SafeLoader):
    pass


def _mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    written: set[Any] = set()
    for key_node, _ in node.value:  # keys written here, before merges (``<<``) are expanded
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in written:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        written.add(key)
    loader.flatten_mapping(node)  # merged keys first: the keys written here override them
    out = LineDict()
    out.line = node.start_mark.line + 1
    out.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        out.key_lines[key] = key_node.start_mark.line + 1
        out[key] = loader.construct_object(value_node, deep=True)
    return out


def _sequence(loader: _LineLoader, node: yaml.SequenceNode) -> LineList:
    out = LineList(loader.construct_object(child, deep=True) for child in node.value)
    out.line = node.start_mark.line + 1
    out.item_lines = [child.start_mark.line + 1 for child in node.value]
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def load_yaml(text: str) -> Any:
    """One YAML document, with :class:`LineDict`/:class:`LineList` for mappings and lists."""
    try:
        return yaml.load(text, Loader=_LineLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise YamlError(problem or "not valid YAML", mark.line + 1 if mark else 0) from exc
    except yaml.YAMLError as exc:
        raise YamlError(f"not valid YAML: {exc}", 0) from exc


def plain(value: Any) -> Any:
    """``value`` with plain dicts and lists (for objects sent over the wire)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value
