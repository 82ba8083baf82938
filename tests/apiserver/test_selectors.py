"""The embedded API server's own selector parsers (``gatekeeper/apiserver/_selectors.py``),
table-driven against apimachinery's rules (``pkg/fields``, ``pkg/labels``)."""

from __future__ import annotations

import pytest

from gatekeeper.apiserver._selectors import (
    FieldTerm,
    LabelTerm,
    SelectorError,
    field_selector_matches,
    label_selector_matches,
    parse_field_selector,
    parse_label_selector,
)

FIELD_PARSES = [
    ("", ()),
    ("spec.nodeName=node-a", (FieldTerm("spec.nodeName", "node-a"),)),
    ("spec.nodeName==node-a", (FieldTerm("spec.nodeName", "node-a"),)),
    ("spec.nodeName!=node-a", (FieldTerm("spec.nodeName", "node-a", negated=True),)),
    # Terms are sorted, empty ones skipped.
    (
        "spec.nodeName=a,,metadata.name=b",
        (FieldTerm("metadata.name", "b"), FieldTerm("spec.nodeName", "a")),
    ),
    (r"metadata.name=a\,b\=c\\d", (FieldTerm("metadata.name", r"a,b=c\d"),)),
    ("metadata.name=", (FieldTerm("metadata.name", ""),)),
    ("=x", (FieldTerm("", "x"),)),  # refused later as an unknown field
]

FIELD_ERRORS = [
    ("spec.nodeName", "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"),
    ("a=b=c", "invalid field selector: unescaped character in value: 61"),
    (r"a=b\x", r"invalid field selector: invalid escape sequence: \x"),
    ("a=b\\", "invalid field selector: invalid escape sequence: \\"),
]


@pytest.mark.parametrize(
    ("text", "terms"), FIELD_PARSES, ids=[t or "empty" for t, _ in FIELD_PARSES]
)
def test_field_selector_parses(text: str, terms: tuple[FieldTerm, ...]) -> None:
    assert parse_field_selector(text) == terms


@pytest.mark.parametrize(("text", "message"), FIELD_ERRORS, ids=[t for t, _ in FIELD_ERRORS])
def test_field_selector_errors(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_field_selector(text)
    assert str(info.value) == message


def test_field_selector_matches_absent_fields_as_empty() -> None:
    fields = {"spec.nodeName": "node-a"}
    assert field_selector_matches(parse_field_selector("spec.nodeName=node-a"), fields)
    assert not field_selector_matches(parse_field_selector("spec.nodeName!=node-a"), fields)
    assert field_selector_matches(parse_field_selector("spec.driver="), fields)
    assert field_selector_matches(parse_field_selector("spec.driver!=x"), fields)


LABEL_PARSES = [
    ("", ()),
    ("a", (LabelTerm("a", "exists"),)),
    ("!a", (LabelTerm("a", "!"),)),
    ("a=b", (LabelTerm("a", "=", ("b",)),)),
    ("a==b", (LabelTerm("a", "==", ("b",)),)),
    ("a!=b", (LabelTerm("a", "!=", ("b",)),)),
    ("a=", (LabelTerm("a", "=", ("",)),)),
    ("a in (y,x,x)", (LabelTerm("a", "in", ("x", "y")),)),
    ("a notin (x)", (LabelTerm("a", "notin", ("x",)),)),
    ("a in ()", (LabelTerm("a", "in", ("",)),)),  # apimachinery: "()" is the set {""}
    ("a in (,x)", (LabelTerm("a", "in", ("", "x")),)),
    ("a in (x,)", (LabelTerm("a", "in", ("", "x")),)),
    ("a in (in)", (LabelTerm("a", "in", ("in",)),)),  # a keyword is a value in a set
    ("a>5", (LabelTerm("a", "gt", ("5",)),)),
    ("a<5", (LabelTerm("a", "lt", ("5",)),)),
    ("example.com/k=v", (LabelTerm("example.com/k", "=", ("v",)),)),
    ("b=1, a=2", (LabelTerm("a", "=", ("2",)), LabelTerm("b", "=", ("1",)))),  # sorted by key
]

LABEL_ERRORS = [
    "a in (b",
    "a in b",
    "a=b=c",
    "a,",
    ",a",
    "!a=b",
    "a>x",
    "a<-5",  # every value must also be a valid label value
    "a=b c",
    "a=" + "x" * 64,
    "-a=b",
    "Example.com/a=b",
    "a b",
    "a in (b c)",
    "a ! b",
]


@pytest.mark.parametrize(
    ("text", "terms"), LABEL_PARSES, ids=[t or "empty" for t, _ in LABEL_PARSES]
)
def test_label_selector_parses(text: str, terms: tuple[LabelTerm, ...]) -> None:
    assert parse_label_selector(text) == terms


@pytest.mark.parametrize("text", LABEL_ERRORS)
def test_label_selector_errors(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(text)


def test_label_selector_error_words_are_apimachinerys() -> None:
    with pytest.raises(SelectorError) as info:
        parse_label_selector("a,")
    assert str(info.value) == "found '', expected: identifier after ','"
    with pytest.raises(SelectorError) as info:
        parse_label_selector("a in (b")
    assert str(info.value) == "unable to parse requirement: found '', expected: ',' or ')'"


LABEL_MATCHES = [
    ("a", {"a": ""}, True),
    ("a", {}, False),
    ("!a", {}, True),
    ("a=b", {"a": "b"}, True),
    ("a!=b", {}, True),
    ("a!=b", {"a": "b"}, False),
    ("a in ()", {"a": ""}, True),
    ("a in ()", {}, False),
    ("a notin (x)", {}, True),
    ("a>5", {"a": "6"}, True),
    ("a>5", {"a": "x"}, False),
    ("a>5", {}, False),
    ("a<5", {"a": "99999999999999999999"}, False),  # not an int64: no match
    ("a=b,c", {"a": "b"}, False),
]


@pytest.mark.parametrize(
    ("text", "labels", "expected"),
    LABEL_MATCHES,
    ids=[f"{t}-{labels}" for t, labels, _ in LABEL_MATCHES],
)
def test_label_selector_matches(text: str, labels: dict[str, str], expected: bool) -> None:
    assert label_selector_matches(parse_label_selector(text), labels) is expected
