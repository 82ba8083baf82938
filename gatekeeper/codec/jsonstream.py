"""A JSON list document read as it arrives, one item at a time (docs/operating.md#filtered-reads).

:class:`ListReader` takes the chunks of ``{"kind": …, "metadata": {…}, "items": [ … ]}`` and
hands back each item of ``items`` as soon as it is complete, parsed, with its exact text; the
other top-level members are parsed whole into :attr:`ListReader.members`. It holds no more than
the item being read and what is left of the current chunk, so a filtered list of any size
costs the memory of its largest item, and each parse is one item's: no single parse holds the
event loop for the whole list.

Items are parsed with the standard library's C decoder (``raw_decode``: where an item ends is
known only by parsing it); an item it cannot take (nested past the interpreter's recursion
limit) is bracket-matched and parsed by :func:`~gatekeeper.codec.jsonbounds.parse_bounded`.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gatekeeper.codec.jsonbounds import MAX_OBJECT_DEPTH, parse_bounded

__all__ = ["Item", "ListReader", "ValueTooLarge"]

_DECODER = json.JSONDecoder()
_WS = re.compile(r"[ \t\n\r]*")
# A JSON string (possessive: linear on long strings) or one bracket: the end of an item the
# C decoder cannot take is found by matching brackets.
_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')

# Where the reader is: before "{"; after "{" (a key or "}"); after "," (a key); after a key;
# after ":"; after a member (",", "}"); after "items": "[" (an item or "]"); after "," in items;
# after an item ("," or "]"); after the final "}".
(_START, _OPENED, _KEY, _COLON, _VALUE, _MEMBER_DONE, _ITEMS_OPENED, _ITEM, _ITEM_DONE,
 _DONE) = range(10)  # fmt: skip


class ValueTooLarge(ValueError):
    """One item (or member) of the document is longer than the reader's ``max_value``."""


@dataclass(frozen=True, slots=True)
class Item:
    """One complete item of ``items``: its parsed value and its exact text."""

    value: Any
    text: str


class ListReader:
    """Feed it chunks; it returns the items each chunk completed (see the module docstring).

    Raises ``ValueError`` on anything that is not one JSON object (an ``items`` that is not an
    array is kept as a member like any other: the caller checks :attr:`saw_items`), and
    :class:`ValueTooLarge` when one value exceeds ``max_value`` characters.
    """

    def __init__(self, max_value: int) -> None:
        self.max_value = max_value
        self.members: dict[str, Any] = {}
        """Top-level members other than ``items``, parsed, as far as read."""
        self.saw_items = False
        """Whether the ``items`` array has begun."""
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._pos = 0
        self._state = _START
        self._key = ""
        self._need = 0
        """Characters that must be pending before a value that did not parse is tried again:
        doubled each time, so a large item arriving in many chunks costs linear time."""
        self._eof = False

    @property
    def done(self) -> bool:
        """Whether the whole document has been read."""
        return self._state == _DONE

    def feed(self, chunk: bytes) -> Iterator[Item]:
        """The items ``chunk`` completed (maybe none), parsed one by one as they are taken: a
        caller that lets go of each holds one parsed item at a time. Take them all before the
        next call."""
        self._text = self._text[self._pos :] + self._decoder.decode(chunk)
        self._pos = 0
        return self._run()

    def end(self) -> Iterator[Item]:
        """The last items; ValueError (when taken) if the document is incomplete."""
        self._text = self._text[self._pos :] + self._decoder.decode(b"", final=True)
        self._pos = 0
        self._eof = True
        yield from self._run()
        if self._state != _DONE:
            raise ValueError("the JSON document ended early")

    def _run(self) -> Iterator[Item]:
        items: list[Item] = []
        while self._step(items):
            if items:
                yield items.pop()

    def _step(self, items: list[Item]) -> bool:
        """Read one token or value; False when more text is needed."""
        text = self._text
        self._pos = pos = _WS.match(text, self._pos).end()  # type: ignore[union-attr]
        if pos >= len(text):
            return False
        char, state = text[pos], self._state
        if state == _START:
            self._state = self._punctuation(char, {"{": _OPENED}, "a JSON object")
        elif state == _COLON:
            self._state = self._punctuation(char, {":": _VALUE}, "':' after a member name")
        elif state == _MEMBER_DONE:
            self._state = self._punctuation(char, {",": _KEY, "}": _DONE}, "',' or '}'")
        elif state == _ITEM_DONE:
            self._state = self._punctuation(char, {",": _ITEM, "]": _MEMBER_DONE}, "',' or ']'")
        elif state in (_OPENED, _ITEMS_OPENED) and char in "}]":
            closes = {_OPENED: ("}", _DONE), _ITEMS_OPENED: ("]", _MEMBER_DONE)}[state]
            self._state = self._punctuation(char, {closes[0]: closes[1]}, "a value")
        elif state in (_OPENED, _KEY):
            return self._member_name()
        elif state == _VALUE and self._key == "items" and char == "[":
            self._pos += 1
            self.saw_items = True
            self._state = _ITEMS_OPENED
        elif state == _VALUE:
            return self._member_value()
        elif state in (_ITEMS_OPENED, _ITEM):
            return self._item(items)
        else:
            raise ValueError(f"extra data after the JSON document: {char!r}")
        return True

    def _punctuation(self, char: str, allowed: dict[str, int], what: str) -> int:
        if char not in allowed:
            raise ValueError(f"expected {what}, found {char!r}")
        self._pos += 1
        return allowed[char]

    def _member_name(self) -> bool:
        parsed = self._value()
        if parsed is None:
            return False
        name, self._pos = parsed
        if not isinstance(name, str):
            raise ValueError("expected a member name")
        self._key, self._state = name, _COLON
        return True

    def _member_value(self) -> bool:
        parsed = self._value()
        if parsed is None:
            return False
        self.members[self._key], self._pos = parsed
        self._state = _MEMBER_DONE
        return True

    def _item(self, items: list[Item]) -> bool:
        start = self._pos
        parsed = self._value()
        if parsed is None:
            return False
        value, self._pos = parsed
        items.append(Item(value, self._text[start : self._pos]))
        self._state = _ITEM_DONE
        return True

    def _value(self) -> tuple[Any, int] | None:
        """``(value, end)`` of the JSON value at the current position; None: more is needed."""
        text, pos = self._text, self._pos
        if len(text) - pos < self._need and not self._eof:
            return None
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            self._incomplete(exc)
            return None
        except RecursionError:
            return self._deep(pos)
        if not self._eof and (end >= len(text) or _number_may_go_on(value, text, end)):
            return None  # a number or literal could go on in the next chunk
        self._need = 0
        return value, end

    def _incomplete(self, exc: ValueError) -> None:
        """Wait for more text (twice what is pending), unless it is all there or too much."""
        pending = len(self._text) - self._pos
        if self._eof:
            raise ValueError(f"invalid JSON: {exc}") from None
        if pending > self.max_value:
            raise ValueTooLarge(f"one value of the list exceeds {self.max_value} bytes")
        self._need = 2 * pending

    def _deep(self, pos: int) -> tuple[Any, int] | None:
        """A value nested deeper than the C decoder recurses: its end found by matching
        brackets, then parsed by the walker (subtrees past the depth limit: ``TOO_DEEP``)."""
        depth = 0
        for match in _TOKEN.finditer(self._text, pos):
            token = match.group()
            if token[0] != '"':
                depth += 1 if token in "[{" else -1
                if depth == 0:
                    end = match.end()
                    self._need = 0
                    return parse_bounded(self._text[pos:end], limit=MAX_OBJECT_DEPTH), end
        self._incomplete(ValueError("unterminated nested value"))
        return None


_NUMBER_TAIL = re.compile(r"[.eE][0-9eE+\-]*")


def _number_may_go_on(value: Any, text: str, end: int) -> bool:
    """Whether a number parsed up to ``end`` is cut short by the chunk's end: what follows is
    the start of a fraction or exponent, to the end of the text (``-0.`` then ``0``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    tail = _NUMBER_TAIL.match(text, end)
    return tail is not None and tail.end() == len(text)
