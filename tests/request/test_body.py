"""Request bodies: JSON only, bounded, unambiguous keys (DESIGN §4.4)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gatekeeper.errors import Refusal
from gatekeeper.request.body import (
    APPLY_YAML,
    MAX_BODY_BYTES,
    decode_body,
    decode_json,
    read_limited,
)

MERGE = "application/merge-patch+json"


async def chunks(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def test_read_limited_joins_chunks() -> None:
    assert await read_limited(chunks(b'{"a"', b": 1}")) == b'{"a": 1}'
    assert MAX_BODY_BYTES == 3 * 1024 * 1024


async def test_read_limited_stops_at_the_limit() -> None:
    read: list[bytes] = []

    async def body() -> AsyncIterator[bytes]:
        for piece in (b"x" * 6, b"x" * 6, b"x" * 6):
            read.append(piece)
            yield piece

    with pytest.raises(Refusal) as refused:
        await read_limited(body(), limit=10)
    assert refused.value.code == 413
    assert refused.value.message == "Request entity too large: limit is 10"
    assert len(read) == 2  # never read past the limit


DECODED = [
    ("json", b'{"a": [1, 2]}', "application/json", False, "application/json", {"a": [1, 2]}),
    ("no-type-is-json", b"{}", "", False, "application/json", {}),
    ("merge-patch", b'{"a": null}', MERGE, True, MERGE, {"a": None}),
    ("json-patch", b"[]", "application/json-patch+json", True, "application/json-patch+json", []),
    ("apply-yaml", b"kind: X\nspec: {a: 1}\n", APPLY_YAML, True, APPLY_YAML,
     {"kind": "X", "spec": {"a": 1}}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "media_type", "patch", "effective", "value"),
    [c[1:] for c in DECODED],
    ids=[c[0] for c in DECODED],
)
def test_decoded(raw: bytes, media_type: str, patch: bool, effective: str, value: Any) -> None:
    assert decode_body(raw, media_type, patch=patch) == (effective, value)


REFUSED = [
    ("yaml-create", b"kind: X", "application/yaml", False, 415, "unknown format"),
    ("protobuf", b"\x00", "application/vnd.kubernetes.protobuf", False, 415, "unknown format"),
    ("json-as-patch", b"{}", "application/json", True, 415, "accepted media types include"),
    ("patch-without-type", b"{}", "", True, 415, "accepted media types include"),
    ("duplicate-key", b'{"a": 1, "a": 2}', "application/json", False, 400,
     'duplicate key: "a" and "a"'),
    ("case-collision", b'{"driver": "a", "Driver": "b"}', "application/json", False, 400,
     'keys differing only in case: "driver" and "Driver"'),
    ("nested-collision", b'{"spec": {"x": 1, "X": 2}}', MERGE, True, 400, "differing only in case"),
    ("nan", b'{"a": NaN}', "application/json", False, 400, "NaN is not JSON"),
    ("not-utf8", b'{"a": "\xff"}', "application/json", False, 400, "not UTF-8"),
    ("not-json", b"{", "application/json", False, 400, "not valid JSON"),
    ("yaml-duplicate", b"a: 1\na: 2\n", APPLY_YAML, True, 400, 'duplicate key: "a" and "a"'),
    ("yaml-non-string-key", b"1: a\n", APPLY_YAML, True, 400, "not a string"),
    ("yaml-invalid", b"a: [\n", APPLY_YAML, True, 400, "not valid YAML"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "media_type", "patch", "code", "message"),
    [c[1:] for c in REFUSED],
    ids=[c[0] for c in REFUSED],
)
def test_refused(raw: bytes, media_type: str, patch: bool, code: int, message: str) -> None:
    with pytest.raises(Refusal) as refused:
        decode_body(raw, media_type, patch=patch)
    assert refused.value.code == code
    assert message in refused.value.message


def test_decode_json_keeps_order_and_types() -> None:
    assert list(decode_json(b'{"b": 1, "a": 1.5, "c": true}').items()) == [
        ("b", 1),
        ("a", 1.5),
        ("c", True),
    ]
