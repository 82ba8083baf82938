"""Bounded JSON (``gatekeeper/apiserver/_json.py``): the apiserver's 10,000-level limit, deep
documents read and written, numbers no float64 holds, and the recursion limit left alone."""

from __future__ import annotations

import json
import sys

import pytest

from gatekeeper.apiserver._json import (
    MAX_DEPTH,
    BigNumber,
    DepthExceeded,
    JSONSyntaxError,
    deep,
    dumps,
    find_big_number,
    loads,
)


def _nested(depth: int, opener: str = "[") -> str:
    closer = {"[": "]", "{": "}"}[opener]
    inner = '{"a":' if opener == "{" else "["
    if opener == "{":
        return inner * (depth - 1) + "{}" + closer * (depth - 1)
    return inner * depth + closer * depth


@pytest.mark.parametrize("opener", ["[", "{"])
def test_the_limit_is_10000_levels(opener: str) -> None:
    limit = sys.getrecursionlimit()
    doc = loads(_nested(MAX_DEPTH, opener))
    assert dumps(doc) == _nested(MAX_DEPTH, opener)
    with pytest.raises(DepthExceeded) as info:
        loads(_nested(MAX_DEPTH + 1, opener))
    assert str(info.value) == f"invalid character '{opener}' exceeded max depth"
    assert sys.getrecursionlimit() == limit  # raised only inside the deep call


def test_brackets_inside_strings_do_not_count() -> None:
    text = '{"a":"' + "[" * (MAX_DEPTH + 5) + '"}'
    assert loads(text) == {"a": "[" * (MAX_DEPTH + 5)}


def test_shallow_documents_take_the_ordinary_path() -> None:
    assert loads(b'{"a":[1,2.5,"x",null,true]}') == {"a": [1, 2.5, "x", None, True]}
    assert dumps({"a": [1, None]}) == '{"a":[1,null]}'


def test_deep_reraises_the_callees_error_in_the_caller() -> None:
    def fails(depth: int) -> None:
        if depth:
            fails(depth - 1)
        raise KeyError("bottom")

    with pytest.raises(KeyError):
        deep(fails, 5000)


def test_big_numbers_are_marked_and_found() -> None:
    doc = loads('{"spec":{"devices":[{"attributes":{"i":{"int":1e400}}}]},"ok":1e300}')
    found = find_big_number(doc)
    assert found is not None
    path, number = found
    assert path == ["spec", "devices", 0, "attributes", "i", "int"]
    assert isinstance(number, BigNumber) and number.text == "1e400"
    assert find_big_number(loads('{"ok":1e300}')) is None


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_json_constants_are_refused(literal: str) -> None:
    with pytest.raises(JSONSyntaxError):
        loads('{"a":' + literal + "}")


def test_syntax_errors_stay_json_errors() -> None:
    with pytest.raises(json.JSONDecodeError):
        loads("{")
