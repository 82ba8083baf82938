"""Protobuf bodies written by hand, as gogo (client-go) writes them: for the protobuf reader's
tests, the real tier's, and the benchmark's workloads."""

from __future__ import annotations

from gatekeeper.codec.kubeproto import MAGIC

__all__ = ["envelope", "field", "number", "varint", "wide"]


def varint(value: int) -> bytes:
    """``value``'s low 64 bits as a varint."""
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: bytes | str) -> bytes:
    """Field ``number`` (any size: an aliased tag is written as is, bits past 64 dropped)."""
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def wide(value: int, high: int) -> bytes:
    """A 10-byte varint: ``value``'s low 64 bits, and ``high`` in the bits past 64 (which Go
    drops)."""
    out = bytearray()
    for _ in range(9):
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value & 1 | high << 1])


def number(field_number: int, value: int) -> bytes:
    """Varint field ``field_number``."""
    return varint(field_number << 3) + varint(value)


def envelope(
    meta: bytes,
    *,
    rest: bytes = b"",
    api: str = "resource.k8s.io/v1",
    type_meta_extra: bytes = b"",
) -> bytes:
    """``k8s\\0`` + Unknown{typeMeta, raw = object{metadata = meta, rest}} of a ResourceSlice,
    as gogo writes it (empty contentEncoding and contentType included)."""
    type_meta = field(1, api) + field(2, "ResourceSlice") + type_meta_extra
    raw = field(1, meta) + rest
    return MAGIC + field(1, type_meta) + field(2, raw) + field(3, "") + field(4, "")
