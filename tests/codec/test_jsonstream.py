"""A list document read item by item: the same values as parsing it whole, however it is cut
into chunks; bounded per item; malformed documents refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gatekeeper.codec.jsonbounds import TOO_DEEP, parse_bounded
from gatekeeper.codec.jsonstream import ListReader, ValueTooLarge


def read(document: bytes, cuts: list[int], max_value: int = 1 << 20) -> tuple[list[Any], Any]:
    """Every item, and the reader, for ``document`` fed in pieces cut at ``cuts``."""
    reader = ListReader(max_value)
    items, start = [], 0
    for cut in [*sorted(cuts), len(document)]:
        items += list(reader.feed(document[start:cut]))
        start = cut
    items += list(reader.end())
    for item in items:  # the text is exactly the item's own
        assert parse_bounded(item.text) == item.value
    return [item.value for item in items], reader


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(
    items=st.lists(json_values, max_size=6),
    members=st.dictionaries(st.sampled_from(["kind", "metadata", "apiVersion"]), json_values),
    indent=st.sampled_from([None, 1]),
    data=st.data(),
)
def test_any_chunking_reads_what_a_whole_parse_reads(
    items: list[Any], members: dict[str, Any], indent: int | None, data: st.DataObject
) -> None:
    document = json.dumps({**members, "items": items}, indent=indent).encode()
    cuts = data.draw(st.lists(st.integers(0, len(document)), max_size=8))
    got, reader = read(document, cuts)
    assert got == items and reader.members == members and reader.done and reader.saw_items


def test_a_number_cut_at_a_chunk_boundary_is_not_read_early() -> None:
    got, reader = read(b'{"metadata":{"n":1},"x":12,"items":[34]}', [24, 38])
    assert got == [34] and reader.members["x"] == 12


@pytest.mark.parametrize(
    ("document", "cut"),
    [
        (b'{"metadata": -0.0, "items": [1.5e3]}', 16),  # "-0." then "0"
        (b'{"items": [1.5e3]}', 15),  # "1.5e" then "3"
        (b'{"items": [1.5e-3]}', 15),  # "1.5e" then "-3"
    ],
)
def test_a_fraction_or_exponent_cut_at_a_chunk_boundary_waits_for_its_digits(
    document: bytes, cut: int
) -> None:
    """Found by the property above: a number read up to the chunk's end stopped at its ".", and
    the "." was then taken for what follows the number."""
    got, reader = read(document, [cut])
    assert got == json.loads(document)["items"]
    assert reader.members == {k: v for k, v in json.loads(document).items() if k != "items"}


def test_items_after_and_members_after_the_items() -> None:
    got, reader = read(b'{"items":[{"a":1}],"metadata":{"resourceVersion":"7"}}', [5])
    assert got == [{"a": 1}] and reader.members == {"metadata": {"resourceVersion": "7"}}


def test_multibyte_characters_cut_between_bytes() -> None:
    document = json.dumps({"items": ["é€😀"]}, ensure_ascii=False).encode()
    for cut in range(len(document)):
        assert read(document, [cut])[0] == ["é€😀"]


def test_an_item_too_deep_for_the_c_decoder_is_parsed_and_marked() -> None:
    deep = "[" * 5000 + "]" * 5000
    document = ('{"items":[{"name":"deep","x":' + deep + '},{"name":"ok"}]}').encode()
    got, _ = read(document, list(range(0, len(document), 4096)))
    assert got[1] == {"name": "ok"}
    value: Any = got[0]["x"]
    while value is not TOO_DEEP:
        (value,) = value  # the walker replaced what lies past the depth limit


def test_one_item_past_the_bound_is_refused() -> None:
    document = b'{"items":[{"a":"' + b"x" * 5000 + b'"}]}'
    with pytest.raises(ValueTooLarge):
        read(document, list(range(0, len(document), 512)), max_value=1000)


def test_a_large_item_in_small_chunks_is_parsed_a_few_times_only() -> None:
    """Retries double the text they wait for: linear, not one parse per chunk."""
    document = b'{"items":[{"a":"' + b"x" * 200_000 + b'"}]}'
    reader = ListReader(1 << 20)
    tries = 0
    original = reader._value

    def counted() -> Any:
        nonlocal tries
        if len(reader._text) - reader._pos >= reader._need:
            tries += 1
        return original()

    reader._value = counted  # type: ignore[method-assign]
    for start in range(0, len(document), 100):
        assert not list(reader.feed(document[start : start + 100]))
    assert len(list(reader.end())) == 1
    assert tries < 40, tries


@pytest.mark.parametrize(
    "document",
    [
        b"[1,2]",
        b'{"items":[1,2}',
        b'{"items":[1,]}',
        b'{"items":[1 2]}',
        b'{"a" 1}',
        b'{"a":1,}',
        b'{"items":[]}x',
        b'{"items":[',
        b'{"items":["\xff"]}',
        b"",
    ],
)
def test_malformed_documents_are_refused(document: bytes) -> None:
    with pytest.raises(ValueError):
        read(document, [len(document) // 2])


def test_empty_items_and_empty_object() -> None:
    assert read(b'{"items":[]}', [])[0] == []
    _, reader = read(b"{}", [1])
    assert reader.done and not reader.saw_items
