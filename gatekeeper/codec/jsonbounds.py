"""JSON of bounded depth: request bodies refused past a limit, upstream objects of any depth
read without ``RecursionError`` (the apiserver stores objects up to 10,000 levels deep).

Python's ``json`` recurses in C once per nesting level and raises ``RecursionError`` near
1,000 levels. Rather than raise the interpreter-wide recursion limit (it would apply to every
thread and every recursive function of the process), :func:`parse_bounded` parses with the C
decoder and, only when that overflows, walks the containers on the too-deep spine itself,
iteratively: every subtree the C decoder can take is still parsed in C, and a subtree nested
deeper than the caller's limit is skipped by a bracket scan and replaced by :data:`TOO_DEEP`.
Callers decide per object with :func:`within_depth` (docs/design-decisions.md#bounded-parsing).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Final

import orjson

from gatekeeper.codec.jsoncodec import orjson_exact

__all__ = [
    "MAX_BODY_DEPTH",
    "MAX_OBJECT_DEPTH",
    "TOO_DEEP",
    "finite_float",
    "parse_bounded",
    "shallow",
    "within_depth",
]

MAX_BODY_DEPTH: Final = 100
"""The deepest request body a driver may send (``{}`` is depth 1). The deepest field of any
DRA type is about 10 levels down; only opaque driver data is free-form."""
MAX_OBJECT_DEPTH: Final = 200
"""The deepest upstream object the gatekeeper evaluates (filters, fetches, audits): above
:data:`MAX_BODY_DEPTH` so a driver's own writes stay readable, far below what Python's
recursion (``copy.deepcopy``, ``==``, ``json.dumps``) can take."""


class _TooDeep:
    """The marker left where a subtree nested deeper than the parse limit was skipped."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TOO_DEEP"


TOO_DEEP: Final = _TooDeep()

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")
# A JSON string (possessive: linear on long strings) or one bracket; used to skip a subtree.
_SKIP = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')
_CLOSE = {"{": "}", "[": "]"}
_OPENED, _ITEM, _AFTER = 0, 1, 2  # just opened; an item must follow (after ","); after an item


def finite_float(text: str) -> float:
    """``parse_float`` hook: a JSON number that is not a finite double (``1e400``) is refused."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range (not a finite double)")
    return value


def shallow(raw: bytes | bytearray, limit: int) -> bool:
    """Whether the JSON text ``raw`` cannot nest more than ``limit`` containers deep: every
    level opens a bracket, so fewer brackets than the limit (inside strings too) settle it in C
    without a walk. False says nothing: :func:`within_depth` decides on the parsed value."""
    return raw.count(b"{") + raw.count(b"[") <= limit


def within_depth(value: Any, limit: int) -> bool:
    """Whether ``value`` nests at most ``limit`` containers deep and holds no :data:`TOO_DEEP`.

    Iterative, so it cannot overflow whatever the depth.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if item is TOO_DEEP:
            return False
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children if _nested(child))
    return True


def _nested(value: Any) -> bool:
    return isinstance(value, dict | list) or value is TOO_DEEP


def parse_bounded(text: str | bytes | bytearray, *, limit: int = MAX_OBJECT_DEPTH) -> Any:
    """Parse JSON of any depth; subtrees nested deeper than ``limit`` become :data:`TOO_DEEP`.

    Raises ``ValueError`` on invalid JSON. Skipped subtrees are bracket-matched, not validated.
    """
    if orjson_exact(text):
        try:
            # Fast path: orjson (5 to 10 times the standard library) takes all but >1,024
            # levels and NaN; the standard library then tries, then the walker.
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8")
    try:
        return json.loads(text)
    except RecursionError:
        pass
    start = _WS.match(text, 0).end()  # type: ignore[union-attr]
    value, end = _Walker(text, limit).value(start, 1)
    end = _WS.match(text, end).end()  # type: ignore[union-attr]
    if end != len(text):
        raise ValueError(f"extra data at offset {end}")
    return value


class _Frame:
    __slots__ = ("container", "depth", "key")

    def __init__(self, container: dict[str, Any] | list[Any], depth: int) -> None:
        self.container = container
        self.depth = depth
        self.key: str | None = None


class _Walker:
    """Parses the containers the C decoder cannot, one level at a time, with its own stack."""

    def __init__(self, text: str, limit: int) -> None:
        self.text = text
        self.limit = limit

    def value(self, pos: int, depth: int) -> tuple[Any, int]:
        """The value at ``pos`` (at nesting ``depth``) and the offset after it."""
        text = self.text
        if pos >= len(text):
            raise ValueError("unexpected end of JSON")
        if text[pos] not in _CLOSE:
            return self._decode(pos)
        if depth > self.limit:
            return TOO_DEEP, _skip(text, pos)
        try:
            return self._decode(pos)
        except RecursionError:
            return self._walk(pos, depth)

    def _decode(self, pos: int) -> tuple[Any, int]:
        try:
            return _DECODER.raw_decode(self.text, pos)
        except json.JSONDecodeError as exc:
            raise ValueError(str(exc)) from exc

    def _walk(self, pos: int, depth: int) -> tuple[Any, int]:
        """The container at ``pos``, walked with an explicit stack (no recursion)."""
        text = self.text
        root = _open(text[pos])
        stack = [_Frame(root, depth)]
        pos += 1
        state = _OPENED
        while True:
            frame = stack[-1]
            pos = self._ws(pos)
            closer = "}" if isinstance(frame.container, dict) else "]"
            char = text[pos] if pos < len(text) else ""
            if state != _ITEM and char == closer:
                stack.pop()
                pos += 1
                if not stack:
                    return root, pos
                state = _AFTER
                continue
            if state == _AFTER:
                if char != ",":
                    raise ValueError(f"expected ',' or '{closer}' at offset {pos}")
                pos += 1
                state = _ITEM
                continue
            if isinstance(frame.container, dict):
                pos = self._ws(self._key(pos, frame))
            state = _AFTER
            child_depth = frame.depth + 1
            if pos < len(text) and text[pos] in _CLOSE and child_depth <= self.limit:
                try:
                    item, pos = self._decode(pos)
                except RecursionError:
                    child = _open(text[pos])
                    _store(frame, child)
                    stack.append(_Frame(child, child_depth))
                    pos += 1
                    state = _OPENED
                    continue
            else:
                item, pos = self.value(pos, child_depth)
            _store(frame, item)

    def _key(self, pos: int, frame: _Frame) -> int:
        text = self.text
        if pos >= len(text) or text[pos] != '"':
            raise ValueError(f"expected an object key at offset {pos}")
        key, pos = self._decode(pos)
        pos = self._ws(pos)
        if pos >= len(text) or text[pos] != ":":
            raise ValueError(f"expected ':' at offset {pos}")
        frame.key = key
        return pos + 1

    def _ws(self, pos: int) -> int:
        return _WS.match(self.text, pos).end()  # type: ignore[union-attr]


def _open(char: str) -> dict[str, Any] | list[Any]:
    return {} if char == "{" else []


def _store(frame: _Frame, item: Any) -> None:
    if isinstance(frame.container, dict):
        assert frame.key is not None
        frame.container[frame.key] = item
    else:
        frame.container.append(item)


def _skip(text: str, pos: int) -> int:
    """The offset just past the container opening at ``pos``, found by bracket matching."""
    depth = 0
    for match in _SKIP.finditer(text, pos):
        token = match.group()
        if token[0] == '"':
            continue
        depth += 1 if token in _CLOSE else -1
        if depth == 0:
            return match.end()
    raise ValueError("unexpected end of JSON inside a nested value")
