"""Field selectors parsed and written, labels checked, as k8s.io/apimachinery does
(table-driven)."""

from __future__ import annotations

import pytest

from gatekeeper.codec import selectors
from gatekeeper.codec.selectors import (
    FieldRequirement,
    check_label,
    format_field_selector,
    parse_field_selector,
)

R = FieldRequirement

PARSE_FIELD_CASES = [
    ("empty", "", ()),
    ("one-equal", "spec.nodeName=node-a", (R("spec.nodeName", "=", "node-a"),)),
    ("double-equal-normalized", "spec.driver==gpu", (R("spec.driver", "=", "gpu"),)),
    ("not-equal", "spec.nodeName!=node-a", (R("spec.nodeName", "!=", "node-a"),)),
    (
        "two-terms",
        "spec.nodeName=a,spec.driver=b",
        (R("spec.nodeName", "=", "a"), R("spec.driver", "=", "b")),
    ),
    ("empty-value", "spec.nodeName=", (R("spec.nodeName", "=", ""),)),
    ("empty-terms-skipped", "a=b,,c=d,", (R("a", "=", "b"), R("c", "=", "d"))),
    ("escaped-comma", r"metadata.name=a\,b", (R("metadata.name", "=", "a,b"),)),
    ("escaped-equal", r"metadata.name=a\=b", (R("metadata.name", "=", "a=b"),)),
    ("escaped-backslash", r"metadata.name=a\\b", (R("metadata.name", "=", "a\\b"),)),
    ("escaped-comma-does-not-split", r"a=x\,b\=y", (R("a", "=", "x,b=y"),)),
    ("bang-in-value", "a=b!", (R("a", "=", "b!"),)),
    ("first-operator-wins", "a!=b", (R("a", "!=", "b"),)),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in PARSE_FIELD_CASES], ids=[c[0] for c in PARSE_FIELD_CASES]
)
def test_parse_field_selector(text: str, expected: tuple[FieldRequirement, ...]) -> None:
    assert parse_field_selector(text) == expected


BAD_FIELD_CASES = [
    ("no-operator", "spec.nodeName", "can't understand 'spec.nodeName'"),
    ("no-operator-in-second-term", "a=b,c", "can't understand 'c'"),
    ("unescaped-equal-in-value", "a=b=c", "unescaped character"),
    ("unknown-escape", r"a=b\x", r"invalid escape sequence: \x"),
    # The apiserver knows only \\ \, \= (k8s.io/apimachinery/pkg/fields.UnescapeValue).
    ("bang-escape-is-not-an-apiserver-escape", r"a=b\!", r"invalid escape sequence: \!"),
    ("trailing-backslash", "a=b\\", "invalid escape sequence"),
    ("empty-field", "=x", "empty field name"),
]


@pytest.mark.parametrize(
    ("text", "message"), [c[1:] for c in BAD_FIELD_CASES], ids=[c[0] for c in BAD_FIELD_CASES]
)
def test_parse_field_selector_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("\\", "\\\\")):
        parse_field_selector(text)


ROUND_TRIP_CASES = [
    ("plain", (R("spec.nodeName", "=", "node-a"), R("spec.driver", "!=", "gpu"))),
    ("special-characters", (R("metadata.name", "=", "a,b=c\\d!e"),)),
    ("empty-value", (R("spec.nodeName", "=", ""),)),
]


@pytest.mark.parametrize(
    "reqs", [c[1] for c in ROUND_TRIP_CASES], ids=[c[0] for c in ROUND_TRIP_CASES]
)
def test_format_field_selector_round_trips(reqs: tuple[FieldRequirement, ...]) -> None:
    assert parse_field_selector(format_field_selector(reqs)) == reqs


def test_format_field_selector_normalizes_double_equal_and_escapes() -> None:
    assert format_field_selector([R("a", "==", "x,y")]) == r"a=x\,y"
    with pytest.raises(ValueError):
        format_field_selector([R("a", "in", "x")])


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("kubernetes.io/hostname", "node-a", ""),
        ("zone", "", ""),
        ("Bad_/zone", "a", "prefix must be a DNS subdomain"),
        ("-zone", "a", "name part must be at most 63 characters"),
        ("zone", "a" * 64, "invalid label value"),
        ("zone", "a b", "invalid label value"),
    ],
    ids=["prefixed", "empty-value", "bad-prefix", "bad-name", "long-value", "bad-value"],
)
def test_check_label(key: str, value: str, message: str) -> None:
    if not message:
        check_label(key, value)
        return
    with pytest.raises(ValueError, match=message):
        check_label(key, value)


def test_all_is_exported() -> None:
    for name in selectors.__all__:
        assert hasattr(selectors, name)
