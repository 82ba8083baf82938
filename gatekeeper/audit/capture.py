"""A bounded copy of a response body for ``responseObject`` (RequestResponse level only)."""

from __future__ import annotations

from typing import Any

from gatekeeper.codec.jsonbounds import MAX_OBJECT_DEPTH, parse_bounded, shallow, within_depth

__all__ = ["MAX_CAPTURED_RESPONSE", "ResponseCapture"]

MAX_CAPTURED_RESPONSE = 256 * 1024
"""Larger responses (big lists) are not logged: the log must not grow with list sizes."""


class ResponseCapture:
    """Keeps the first ``limit`` bytes of a JSON response; gives up past the limit.

    Built disabled for watches, non-JSON bodies and levels below RequestResponse, so the
    streaming path pays one branch per chunk.
    """

    __slots__ = ("_chunks", "_enabled", "_limit", "_size")

    def __init__(self, enabled: bool, content_type: str, limit: int = MAX_CAPTURED_RESPONSE):
        media_type = content_type.split(";", 1)[0].strip().lower()
        self._enabled = enabled and media_type == "application/json"
        self._limit = limit
        self._chunks: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        if not self._enabled:
            return
        self._size += len(chunk)
        if self._size > self._limit:
            self._enabled = False
            self._chunks.clear()
            return
        self._chunks.append(bytes(chunk))

    def result(self) -> dict[str, Any] | None:
        """The decoded JSON object, or None (disabled, too large or not a JSON object)."""
        if not self._enabled or not self._chunks:
            return None
        raw = b"".join(self._chunks)
        try:
            value = parse_bounded(raw, limit=MAX_OBJECT_DEPTH)
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        # Too deep to serialize safely into the log: the event keeps its metadata only.
        deep = not shallow(raw, MAX_OBJECT_DEPTH) and not within_depth(value, MAX_OBJECT_DEPTH)
        return None if deep else value
