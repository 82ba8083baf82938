"""Field and label selectors, parsed and matched exactly as the kube-apiserver does (pure, no I/O).

Field selectors follow ``k8s.io/apimachinery/pkg/fields``: terms split on unescaped ``,``;
operators ``!=``, ``==`` (normalized to ``=``) and ``=``; values unescaped with the only
escapes the apiserver knows: ``\\\\``, ``\\,`` and ``\\=``. Label selectors follow
``k8s.io/apimachinery/pkg/labels``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gatekeeper.names import is_dns_subdomain

__all__ = [
    "FieldRequirement",
    "LabelRequirement",
    "LabelSelector",
    "check_label",
    "escape_field_value",
    "format_field_selector",
    "matches_fields",
    "matches_labels",
    "parse_field_selector",
    "parse_label_selector",
]


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """One ``field<op>value`` term of a field selector; ``value`` is unescaped."""

    field: str
    operator: str  # "=" or "!="
    value: str


# --- field selectors -------------------------------------------------------------------------

_FIELD_OPERATORS = ("!=", "==", "=")  # order matters: the apiserver tries "!=" then "==" then "="


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not backslash-escaped; escapes are kept in the terms."""
    terms: list[str] = []
    start = 0
    in_slash = False
    for i, char in enumerate(text):
        if in_slash:
            in_slash = False
        elif char == "\\":
            in_slash = True
        elif char == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


def _split_term(term: str) -> tuple[str, str, str] | None:
    """The first operator occurrence splits the term (no escaping in the field name)."""
    for i in range(len(term)):
        for op in _FIELD_OPERATORS:
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op) :]
    return None


def _unescape_value(raw: str) -> str:
    out: list[str] = []
    in_slash = False
    for char in raw:
        if in_slash:
            if char not in "\\,=":
                raise ValueError(f"invalid field selector: invalid escape sequence: \\{char}")
            out.append(char)
            in_slash = False
        elif char == "\\":
            in_slash = True
        elif char in ",=":
            raise ValueError(f"invalid field selector: unescaped character in value: {char!r}")
        else:
            out.append(char)
    if in_slash:
        raise ValueError("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


def escape_field_value(value: str) -> str:
    """Escape ``\\``, ``,`` and ``=`` so that ``value`` survives a field selector literally."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def parse_field_selector(text: str) -> tuple[FieldRequirement, ...]:
    """Parse a ``fieldSelector`` query value; ``""`` → ``()``; ValueError on bad syntax.

    Empty terms (``a=b,,c=d``) are skipped, as the apiserver does; an empty field name is
    refused (the apiserver would refuse it later as an unknown field).
    """
    reqs: list[FieldRequirement] = []
    for term in _split_terms(text) if text else []:
        if not term:
            continue
        split = _split_term(term)
        if split is None:
            raise ValueError(f"invalid selector: '{text}'; can't understand '{term}'")
        field, op, raw = split
        if not field.strip():
            raise ValueError(f"invalid selector: '{text}'; empty field name in '{term}'")
        reqs.append(FieldRequirement(field, "!=" if op == "!=" else "=", _unescape_value(raw)))
    return tuple(reqs)


def format_field_selector(reqs: Iterable[FieldRequirement]) -> str:
    """The inverse of :func:`parse_field_selector`, escaping values."""
    parts = []
    for req in reqs:
        if req.operator not in ("=", "!=", "=="):
            raise ValueError(f"bad field selector operator {req.operator!r}")
        op = "=" if req.operator == "==" else req.operator
        parts.append(f"{req.field}{op}{escape_field_value(req.value)}")
    return ",".join(parts)


def matches_fields(reqs: Iterable[FieldRequirement], values: Mapping[str, str]) -> bool:
    """True if every requirement holds; an absent field counts as ``""`` (as the apiserver)."""
    for req in reqs:
        actual = values.get(req.field, "")
        if (actual == req.value) != (req.operator != "!="):
            return False
    return True


# --- label selectors -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One label selector requirement.

    ``operator`` is one of ``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!`` (does not
    exist), ``gt``, ``lt``; ``values`` holds the operand(s), empty for ``exists``/``!``.
    """

    key: str
    operator: str
    values: tuple[str, ...] = ()


LabelSelector = tuple[LabelRequirement, ...]

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_NAME_RE = re.compile(rf"^{_NAME}$")
_TOKEN_RE = re.compile(r"\s*(!=|==|=|!|\(|\)|,|<|>|[^\s!=(),<>]+)")


def _check_key(key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if "/" in key and not is_dns_subdomain(prefix):
        raise ValueError(f"invalid label key {key!r}: prefix must be a DNS subdomain")
    if len(name) > 63 or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid label key {key!r}: name part must be at most 63 characters of "
            "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        )


def check_label(key: str, value: str) -> None:
    """ValueError unless ``key=value`` is a valid Kubernetes label."""
    _check_key(key)
    _check_value(value)


def _check_value(value: str) -> None:
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        raise ValueError(
            f"invalid label value {value!r}: must be empty or at most 63 characters of "
            "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        )


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN_RE.match(text, pos)
        if match is None:  # pragma: no cover - the pattern matches any non-blank text
            raise ValueError(f"unable to parse label selector {text!r} at {pos}")
        tokens.append(match.group(1))
        pos = match.end()
    return tokens


class _LabelParser:
    """A small recursive-descent parser over the tokens of one label selector."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValueError(f"unable to parse requirement: unexpected end of {self.text!r}")
        self.pos += 1
        return token

    def parse(self) -> LabelSelector:
        reqs: list[LabelRequirement] = []
        while self.peek() is not None:
            reqs.append(self.requirement())
            token = self.peek()
            if token is None:
                break
            if token != ",":
                raise ValueError(f"unable to parse requirement: expected ',' but found {token!r}")
            self.take()
            if self.peek() is None:
                raise ValueError(f"unable to parse requirement: trailing ',' in {self.text!r}")
        return tuple(reqs)

    def requirement(self) -> LabelRequirement:
        token = self.take()
        if token == "!":
            key = self.take()
            _check_key(key)
            return LabelRequirement(key, "!")
        key = token
        _check_key(key)
        nxt = self.peek()
        if nxt is None or nxt == ",":
            return LabelRequirement(key, "exists")
        op = self.take()
        if op in ("=", "==", "!="):
            value = "" if self.peek() in (None, ",") else self.take()
            _check_value(value)
            return LabelRequirement(key, "!=" if op == "!=" else "=", (value,))
        if op in ("in", "notin"):
            return LabelRequirement(key, op, self.value_set())
        if op in ("<", ">"):
            value = self.take()
            if not re.fullmatch(r"-?[0-9]+", value):
                raise ValueError(f"unable to parse requirement: {value!r} is not an integer")
            return LabelRequirement(key, "lt" if op == "<" else "gt", (value,))
        raise ValueError(f"unable to parse requirement: unknown operator {op!r} after {key!r}")

    def value_set(self) -> tuple[str, ...]:
        if self.take() != "(":
            raise ValueError("unable to parse requirement: expected '(' after in/notin")
        values: list[str] = []
        while True:
            token = self.take()
            if token == ")" and not values:
                raise ValueError("unable to parse requirement: in/notin needs at least one value")
            if token in (",", ")"):  # an empty value: "(a,,b)" or "(a,)"
                values.append("")
            else:
                _check_value(token)
                values.append(token)
                token = self.take()
            if token == ")":
                return tuple(values)
            if token != ",":
                raise ValueError(f"unable to parse requirement: unexpected {token!r} in value set")


def parse_label_selector(text: str) -> LabelSelector:
    """Parse a ``labelSelector`` query value; ``""`` → ``()``; ValueError on bad syntax."""
    return _LabelParser(text).parse()


def _requirement_matches(req: LabelRequirement, labels: Mapping[str, str]) -> bool:
    present = req.key in labels
    value = labels.get(req.key, "")
    if req.operator == "exists":
        return present
    if req.operator == "!":
        return not present
    if req.operator in ("=", "in"):
        return present and value in req.values
    if req.operator in ("!=", "notin"):
        return not present or value not in req.values
    if req.operator in ("gt", "lt"):
        if not present or not re.fullmatch(r"-?[0-9]+", value):
            return False
        have, want = int(value), int(req.values[0])
        return have > want if req.operator == "gt" else have < want
    raise ValueError(f"unknown label selector operator {req.operator!r}")


def matches_labels(selector: LabelSelector | str, labels: Mapping[str, str] | None) -> bool:
    """True if ``labels`` satisfies every requirement (a string selector is parsed first)."""
    reqs = parse_label_selector(selector) if isinstance(selector, str) else selector
    have = labels or {}
    return all(_requirement_matches(req, have) for req in reqs)
