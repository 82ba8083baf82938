"""Field and label selectors: parsed and matched as k8s.io/apimachinery does (table-driven)."""

from __future__ import annotations

import pytest

from gatekeeper.codec import selectors
from gatekeeper.codec.selectors import (
    FieldRequirement,
    LabelRequirement,
    format_field_selector,
    matches_fields,
    matches_labels,
    parse_field_selector,
    parse_label_selector,
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


MATCH_FIELD_CASES = [
    ("equal-match", "spec.nodeName=a", {"spec.nodeName": "a"}, True),
    ("equal-mismatch", "spec.nodeName=a", {"spec.nodeName": "b"}, False),
    ("not-equal", "spec.nodeName!=a", {"spec.nodeName": "b"}, True),
    ("absent-is-empty", "spec.nodeName=", {}, True),
    ("absent-not-equal", "spec.nodeName!=a", {}, True),
    ("and", "a=1,b=2", {"a": "1", "b": "2"}, True),
    ("and-one-fails", "a=1,b=2", {"a": "1", "b": "3"}, False),
    ("empty-selector", "", {"a": "1"}, True),
]


@pytest.mark.parametrize(
    ("text", "values", "expected"),
    [c[1:] for c in MATCH_FIELD_CASES],
    ids=[c[0] for c in MATCH_FIELD_CASES],
)
def test_matches_fields(text: str, values: dict[str, str], expected: bool) -> None:
    assert matches_fields(parse_field_selector(text), values) is expected


L = LabelRequirement

PARSE_LABEL_CASES = [
    ("empty", "", ()),
    ("equal", "kind=generated", (L("kind", "=", ("generated",)),)),
    ("double-equal", "kind==generated", (L("kind", "=", ("generated",)),)),
    ("not-equal", "kind!=x", (L("kind", "!=", ("x",)),)),
    ("exists", "kind", (L("kind", "exists"),)),
    ("not-exists", "!kind", (L("kind", "!"),)),
    ("in", "env in (a, b)", (L("env", "in", ("a", "b")),)),
    ("notin", "env notin (a)", (L("env", "notin", ("a",)),)),
    ("prefixed-key", "example.com/tier=x", (L("example.com/tier", "=", ("x",)),)),
    ("empty-value", "a=", (L("a", "=", ("",)),)),
    ("several", "a=b, !c ,d in (e)", (L("a", "=", ("b",)), L("c", "!"), L("d", "in", ("e",)))),
    ("gt", "n>3", (L("n", "gt", ("3",)),)),
]


@pytest.mark.parametrize(
    ("text", "expected"), [c[1:] for c in PARSE_LABEL_CASES], ids=[c[0] for c in PARSE_LABEL_CASES]
)
def test_parse_label_selector(text: str, expected: tuple[LabelRequirement, ...]) -> None:
    assert parse_label_selector(text) == expected


BAD_LABEL_CASES = [
    ("bad-key", "-a=b"),
    ("bad-value", "a=-b-"),
    ("empty-set", "a in ()"),
    ("missing-paren", "a in b"),
    ("trailing-comma", "a=b,"),
    ("two-values", "a=b c"),
    ("gt-not-int", "a>b"),
    ("unknown-operator", "a ~ b"),
]


@pytest.mark.parametrize(
    "text", [c[1] for c in BAD_LABEL_CASES], ids=[c[0] for c in BAD_LABEL_CASES]
)
def test_parse_label_selector_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_label_selector(text)


MATCH_LABEL_CASES = [
    ("equal", "kind=generated", {"kind": "generated"}, True),
    ("equal-absent", "kind=generated", {}, False),
    ("not-equal-absent", "kind!=generated", {}, True),
    ("exists", "kind", {"kind": ""}, True),
    ("not-exists", "!kind", {"kind": "x"}, False),
    ("in", "env in (a,b)", {"env": "b"}, True),
    ("notin-absent", "env notin (a)", {}, True),
    ("notin", "env notin (a)", {"env": "a"}, False),
    ("gt", "n>3", {"n": "4"}, True),
    ("lt-not-int", "n<3", {"n": "x"}, False),
    ("and", "a=1,b=2", {"a": "1", "b": "2"}, True),
]


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    [c[1:] for c in MATCH_LABEL_CASES],
    ids=[c[0] for c in MATCH_LABEL_CASES],
)
def test_matches_labels(text: str, labels: dict[str, str], expected: bool) -> None:
    assert matches_labels(text, labels) is expected
    assert matches_labels(parse_label_selector(text), labels) is expected


def test_all_is_exported() -> None:
    for name in selectors.__all__:
        assert hasattr(selectors, name)
