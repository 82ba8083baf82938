"""Reading the upstream's JSON answers: bounded, and only objects."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gatekeeper.errors import UpstreamError
from gatekeeper.upstream.session import read_json_object


class Chunks:
    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks
        self.read = 0

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.read += 1
            yield chunk


async def test_reads_an_object_across_chunks() -> None:
    assert await read_json_object(Chunks(b'{"a":', b" 1}").iter_any(), "x", limit=100) == {"a": 1}


async def test_stops_reading_at_the_limit() -> None:
    content = Chunks(b"{" + b" " * 10, b" " * 10, b"}")
    with pytest.raises(UpstreamError, match="exceeds 15 bytes: page it") as raised:
        await read_json_object(content.iter_any(), "list", limit=15, too_large=": page it")
    assert raised.value.code == 502
    assert content.read == 2


@pytest.mark.parametrize("payload", [b"[1]", b"nope", b'"s"'], ids=["list", "garbage", "string"])
async def test_refuses_what_is_not_an_object(payload: bytes) -> None:
    with pytest.raises(UpstreamError) as raised:
        await read_json_object(Chunks(payload).iter_any(), "x", limit=100)
    assert raised.value.code == 502
