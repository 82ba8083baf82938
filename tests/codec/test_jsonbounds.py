"""JSON of any depth read without recursion; depth limits judged per object."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gatekeeper.codec.jsonbounds import (
    TOO_DEEP,
    finite_float,
    parse_bounded,
    shallow,
    within_depth,
)

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


def nested(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


def depth_of_chain(value: Any) -> int:
    depth = 0
    while isinstance(value, dict):
        value, depth = value["a"], depth + 1
    return depth


@given(_VALUES, st.sampled_from([None, 1]))
def test_agrees_with_json_where_json_can_parse(value: Any, indent: int | None) -> None:
    text = json.dumps(value, indent=indent)
    assert parse_bounded(text) == json.loads(text)


@given(_VALUES)
def test_the_iterative_walk_agrees_with_json(value: Any) -> None:
    """The same values, each wrapped 2,000 deep so that the C decoder overflows."""
    text = '{"w":' * 2000 + json.dumps(value) + "}" * 2000
    parsed = parse_bounded(text, limit=5000)
    for _ in range(2000):
        parsed = parsed["w"]
    assert parsed == value


@pytest.mark.parametrize("depth", [999, 1000, 5000, 10_000])
def test_deep_documents_parse_and_are_cut_at_the_limit(depth: int) -> None:
    value = parse_bounded(nested(depth), limit=200)
    assert not within_depth(value, 200)
    chain = value
    for _ in range(200):
        chain = chain["a"]
    # What the C decoder could take is whole; past that, the subtree beyond 200 is the marker.
    assert chain is TOO_DEEP or depth_of_chain(chain) == depth - 200


def test_siblings_of_a_deep_subtree_are_kept() -> None:
    text = '{"items":[{"n":1},' + nested(10_000) + ',{"n":"x]}\\""}]}'
    value = parse_bounded(text, limit=50)
    items = value["items"]
    assert items[0] == {"n": 1} and items[2] == {"n": 'x]}"'}
    assert within_depth(items[0], 50) and not within_depth(items[1], 50)


@pytest.mark.parametrize(
    "text",
    ["[" * 3000 + "1," + "]" * 3000, '{"a":' * 3000 + "}" * 3000, "[" * 3000, "[" * 3000 + "]]"],
    ids=["trailing-comma", "missing-value", "unclosed", "extra-closer"],
)
def test_invalid_deep_json_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_bounded(text, limit=5000)


@pytest.mark.parametrize(
    ("value", "limit", "ok"),
    [({}, 1, True), ({"a": {}}, 1, False), ([[1]], 2, True), ([[[]]], 2, False), (1, 0, True)],
)
def test_within_depth(value: Any, limit: int, ok: bool) -> None:
    assert within_depth(value, limit) is ok


@given(_VALUES, st.integers(min_value=0, max_value=6))
def test_shallow_text_is_never_deeper_than_the_limit(value: Any, limit: int) -> None:
    """The bracket count is a shortcut only: whatever it lets through, the walk agrees with."""
    raw = json.dumps(value).encode()
    if shallow(raw, limit):
        assert within_depth(json.loads(raw), limit)


def test_brackets_inside_strings_only_make_the_shortcut_give_way() -> None:
    raw = json.dumps({"a": "[[[[{{{{"}).encode()
    assert not shallow(raw, 3) and within_depth(json.loads(raw), 3)
    assert not shallow(nested(5).encode(), 4) and shallow(nested(5).encode(), 5)


@pytest.mark.parametrize("text", ["1e400", "-1e309", "1E+999"])
def test_finite_float_refuses_overflow(text: str) -> None:
    with pytest.raises(ValueError, match="not a finite double"):
        finite_float(text)


@pytest.mark.parametrize(
    "text",
    ["-9223372036854775809", "18446744073709551616", '{"a":[1,-99999999999999999999]}'],
    ids=["below-int64", "above-uint64", "nested"],
)
def test_integers_beyond_64_bits_stay_integers(text: str) -> None:
    """orjson (3.13) reads them as floats: the standard library reads them."""
    assert parse_bounded(text) == json.loads(text)
    assert parse_bounded(text.encode()) == json.loads(text)
