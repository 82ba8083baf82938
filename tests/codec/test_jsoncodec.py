"""The hot path's JSON: the same values whichever parser ran."""

from __future__ import annotations

import json

import pytest

from gatekeeper.codec.jsoncodec import dumps, loads, orjson_exact


@pytest.mark.parametrize(
    "text",
    ["-9223372036854775809", "18446744073709551616", '{"a":[1,-99999999999999999999]}', "NaN"],
    ids=["below-int64", "above-uint64", "nested", "nan"],
)
def test_what_orjson_reads_otherwise_is_read_by_the_standard_library(text: str) -> None:
    expected = json.loads(text)
    for data in (text, text.encode(), bytearray(text.encode()), memoryview(text.encode())):
        value = loads(data)
        assert value == expected or (value != value and expected != expected)  # NaN


def test_the_fast_path_is_taken_without_long_digit_runs() -> None:
    assert orjson_exact(b'{"a":[1,2,-9223372036854775808.5e0]}') is False
    assert orjson_exact('{"a":[1,2,922337203685477580]}') is True


@pytest.mark.parametrize("size", [0, 18, 19, 20, 65_535, 65_536, 65_553, 65_554, 140_000])
def test_a_long_digit_run_is_found_wherever_it_is(size: int) -> None:
    """Bytes are searched in slices: a run of 19 digits is found at every place, across a
    slice's end too, and 18 digits never count as one."""
    filler = b'{"a":' + b"x" * max(0, size - 5)
    for at in sorted({0, max(0, size - 19), size // 2, 65_536 - 9, 65_536 - 18, 65_536 - 19}):
        if at + 19 > len(filler):
            continue
        for run, found in ((b"7" * 19, True), (b"7" * 18 + b".", False)):
            text = filler[:at] + run + filler[at + 19 :]
            for data in (text, bytearray(text), memoryview(text), text.decode()):
                assert orjson_exact(data) is not found, (size, at, run)


def test_integers_beyond_64_bits_are_written() -> None:
    assert loads(dumps({"a": 2**70})) == {"a": 2**70}
