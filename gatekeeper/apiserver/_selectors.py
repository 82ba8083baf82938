"""Field and label selectors as the apiserver parses and matches them (pure, no I/O).

The embedded API server's own parsers, ported from ``k8s.io/apimachinery`` (``pkg/fields``
``ParseSelector`` and ``pkg/labels`` ``Parse``: its lexer, recursive-descent parser and error
words). They share no code with the gatekeeper's ``selectors`` module on purpose: a fake that
parsed with the gatekeeper's code could not catch the gatekeeper's parser bugs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "FieldTerm",
    "LabelTerm",
    "SelectorError",
    "field_selector_matches",
    "label_selector_matches",
    "parse_field_selector",
    "parse_label_selector",
]


class SelectorError(ValueError):
    """A selector the apiserver refuses (400); the message is apimachinery's."""


# --- fields ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldTerm:
    """``field=value`` (``negated``: ``field!=value``); ``value`` unescaped."""

    field: str
    value: str
    negated: bool = False


_TERM_OPERATORS: Final = ("!=", "==", "=")


def _split_on_unescaped_commas(text: str) -> list[str]:
    parts, start, escaped = [], 0, False
    for i, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _unescape(value: str) -> str:
    out, escaped = [], False
    for char in value:
        if escaped:
            if char not in "\\,=":
                raise SelectorError(f"invalid field selector: invalid escape sequence: \\{char}")
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in ",=":  # Go prints the rune with %v: its code point
            raise SelectorError(
                f"invalid field selector: unescaped character in value: {ord(char)}"
            )
        else:
            out.append(char)
    if escaped:
        raise SelectorError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def parse_field_selector(text: str) -> tuple[FieldTerm, ...]:
    """``fieldSelector``: terms split on unescaped ``,`` (sorted, empty ones skipped), each
    split at the first ``!=``, ``==`` or ``=``."""
    terms: list[FieldTerm] = []
    for part in sorted(_split_on_unescaped_commas(text)):
        if not part:
            continue
        for i in range(len(part)):
            op = next((o for o in _TERM_OPERATORS if part.startswith(o, i)), None)
            if op is not None:
                value = _unescape(part[i + len(op) :])
                terms.append(FieldTerm(part[:i], value, op == "!="))
                break
        else:
            raise SelectorError(f"invalid selector: '{text}'; can't understand '{part}'")
    return tuple(terms)


def field_selector_matches(terms: tuple[FieldTerm, ...], fields: Mapping[str, str]) -> bool:
    """Every term holds; a field the object lacks has the value ``""``."""
    return all((fields.get(t.field, "") == t.value) != t.negated for t in terms)


# --- labels ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LabelTerm:
    """One requirement: ``operator`` is ``in``, ``notin``, ``=``, ``==``, ``!=``, ``exists``,
    ``!``, ``gt`` or ``lt``; ``values`` sorted and distinct."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


_END, _IDENT, _ERROR = "end", "ident", "error"
_SYMBOLS: Final = {
    ")": ")",
    ",": ",",
    "!": "!",
    "==": "==",
    "=": "=",
    ">": ">",
    "<": "<",
    "!=": "!=",
    "(": "(",
}
_KEYWORDS: Final = ("in", "notin")
_SPECIAL: Final = frozenset("=!(),><")
_SPACE: Final = frozenset(" \t\r\n")
_NAME: Final = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_QUALIFIED_NAME: Final = re.compile(rf"^{_NAME}$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_KEY_MESSAGE: Final = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used "
    "for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_VALUE_MESSAGE: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def _lex(text: str) -> list[tuple[str, str]]:
    """apimachinery's label lexer: identifiers and keywords, then the longest operator."""
    tokens: list[tuple[str, str]] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos] in _SPACE:
            pos += 1
        if pos >= n:
            tokens.append((_END, ""))
            return tokens
        if text[pos] in _SPECIAL:
            buffer, last = "", None
            while pos < n and text[pos] in _SPECIAL:
                if buffer + text[pos] in _SYMBOLS:
                    buffer += text[pos]
                    last = buffer
                    pos += 1
                elif last is not None:
                    break
                else:
                    buffer += text[pos]
                    pos += 1
            tokens.append(
                (_SYMBOLS[last], last)
                if last
                else (_ERROR, f"error expected: keyword found '{buffer}'")
            )
            continue
        start = pos
        while pos < n and text[pos] not in _SPECIAL and text[pos] not in _SPACE:
            pos += 1
        word = text[start:pos]
        tokens.append((word, word) if word in _KEYWORDS else (_IDENT, word))


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.tokens = _lex(text)
        self.pos = 0

    def peek(self, values: bool = True) -> tuple[str, str]:
        kind, lit = self.tokens[self.pos]
        return (_IDENT if values and kind in _KEYWORDS else kind), lit

    def take(self, values: bool = True) -> tuple[str, str]:
        token = self.peek(values)
        self.pos += 1
        return token

    def parse(self) -> list[LabelTerm]:
        terms: list[LabelTerm] = []
        while True:
            kind, lit = self.peek()
            if kind == _END:
                return terms
            if kind not in (_IDENT, "!"):
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")
            try:
                terms.append(self.requirement())
            except SelectorError as exc:
                raise SelectorError(f"unable to parse requirement: {exc}") from None
            kind, lit = self.take()
            if kind == _END:
                return terms
            if kind != ",":
                raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")
            kind, lit = self.peek()
            if kind not in (_IDENT, "!"):
                raise SelectorError(f"found '{lit}', expected: identifier after ','")

    def requirement(self) -> LabelTerm:
        kind, key = self.take()
        absent = kind == "!"
        if absent:
            kind, key = self.take()
        if kind != _IDENT:
            raise SelectorError(f"found '{key}', expected: identifier")
        _check_key(key)
        if absent:  # what follows is the caller's to check
            return LabelTerm(key, "!")
        if self.peek()[0] in (_END, ","):
            return LabelTerm(key, "exists")
        kind, lit = self.take(values=False)
        if kind in _KEYWORDS:
            values = self.value_set()
        elif kind in ("=", "==", "!=", ">", "<"):
            values = self.exact_value()
        else:
            raise SelectorError(f"found '{lit}', expected: in, notin, =, ==, !=, gt, lt")
        operator = {">": "gt", "<": "lt"}.get(kind, kind)
        return _requirement(key, operator, values)

    def value_set(self) -> tuple[str, ...]:
        kind, lit = self.take()
        if kind != "(":
            raise SelectorError(f"found '{lit}' expected: '('")
        kind, lit = self.peek()
        if kind == ")":
            self.take()
            return ("",)
        if kind not in (_IDENT, ","):
            raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")
        values: set[str] = set()
        while True:
            kind, lit = self.take()
            if kind == _IDENT:
                values.add(lit)
                nxt, nlit = self.peek()
                if nxt == ")":
                    break
                if nxt != ",":
                    raise SelectorError(f"found '{nlit}', expected: ',' or ')'")
            elif kind == ",":
                if not values:
                    values.add("")  # "(,"
                nxt, _ = self.peek()
                if nxt == ")":
                    values.add("")  # ",)"
                    break
                if nxt == ",":
                    self.take()
                    values.add("")  # ",,"
            else:
                raise SelectorError(f"found '{lit}', expected: ',', or identifier")
        kind, lit = self.take()
        if kind != ")":
            raise SelectorError(f"found '{lit}', expected: ')'")
        return tuple(sorted(values))

    def exact_value(self) -> tuple[str, ...]:
        kind, lit = self.peek()
        if kind in (_END, ","):
            return ("",)
        kind, lit = self.take()
        if kind != _IDENT:
            raise SelectorError(f"found '{lit}', expected: identifier")
        return (lit,)


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise SelectorError(f'key: Invalid value: "{key}": prefix part must be a DNS subdomain')
    if not name or len(name) > 63 or not _QUALIFIED_NAME.match(name):
        raise SelectorError(f'key: Invalid value: "{key}": {_KEY_MESSAGE}')


def _is_int64(text: str) -> bool:
    """Whether Go's ``strconv.ParseInt(text, 10, 64)`` accepts ``text``."""
    return re.fullmatch(r"[+-]?[0-9]+", text) is not None and -(2**63) <= int(text) < 2**63


def _requirement(key: str, operator: str, values: tuple[str, ...]) -> LabelTerm:
    if operator in ("gt", "lt"):
        for i, value in enumerate(values):
            if not _is_int64(value):
                raise SelectorError(
                    f"values[{i}]: Invalid value: \"{value}\": for 'Gt', 'Lt' operators, "
                    "the value must be an integer"
                )
    for i, value in enumerate(values):
        if value and (len(value) > 63 or not _QUALIFIED_NAME.match(value)):
            raise SelectorError(f'values[{i}]: Invalid value: "{value}": {_VALUE_MESSAGE}')
    return LabelTerm(key, operator, values)


def parse_label_selector(text: str) -> tuple[LabelTerm, ...]:
    """``labelSelector``, requirements sorted by key as apimachinery does."""
    return tuple(sorted(_LabelParser(text).parse(), key=lambda t: t.key))


def _holds(term: LabelTerm, labels: Mapping[str, str]) -> bool:
    has = term.key in labels
    value = labels.get(term.key, "")
    if term.operator in ("in", "=", "=="):
        return has and value in term.values
    if term.operator in ("notin", "!="):
        return not has or value not in term.values
    if term.operator == "exists":
        return has
    if term.operator == "!":
        return not has
    if not has or not _is_int64(value):
        return False
    have, want = int(value), int(term.values[0])
    return have > want if term.operator == "gt" else have < want


def label_selector_matches(terms: tuple[LabelTerm, ...], labels: Mapping[str, str]) -> bool:
    """Every requirement holds for ``labels``."""
    return all(_holds(term, labels) for term in terms)
