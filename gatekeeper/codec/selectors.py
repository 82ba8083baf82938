"""Field selectors parsed and written exactly as the kube-apiserver does, and label checks
(pure, no I/O).

Field selectors follow ``k8s.io/apimachinery/pkg/fields``: terms split on unescaped ``,``;
operators ``!=``, ``==`` (normalized to ``=``) and ``=``; values unescaped with the only
escapes the apiserver knows: ``\\\\``, ``\\,`` and ``\\=``. Labels (``--node-label``) are
checked as ``k8s.io/apimachinery/pkg/util/validation`` does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gatekeeper.names import is_dns_subdomain

__all__ = [
    "FieldRequirement",
    "check_label",
    "escape_field_value",
    "format_field_selector",
    "parse_field_selector",
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


# --- labels -------------------------------------------------------------------------------


_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_NAME_RE = re.compile(rf"^{_NAME}$")


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
