"""The protobuf wire format read exactly as Go's generated (gogo) unmarshalers read it, or
refused: the reader under :mod:`gatekeeper.codec.kubeproto`.

The apiserver decodes every Kubernetes protobuf message with generated code that reads a tag
varint into a uint64 (bits past 64 dropped, more than 10 bytes an overflow) and takes
``int32(tag >> 3)`` as the field number: the low 32 bits. A reader that keeps more bits sees an
unknown field where the apiserver sees ``metadata`` (field ``1 + 2**32`` is field 1 to Go). So
this reader accepts a tag only when its field number is the same under both readings
(1 ≤ number ≤ 2**29 - 1, the protobuf maximum), a varint only when it fits 64 bits, and refuses
the rest (DESIGN §4.4: the gatekeeper decides on what the apiserver will read).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "BYTES",
    "FIXED32",
    "FIXED64",
    "MAX_FIELD_NUMBER",
    "VARINT",
    "Field",
    "ProtobufError",
    "ProtobufProblem",
    "bytes_of",
    "fields",
    "length_delimited",
    "replace_field",
    "string_of",
    "unique_fields",
    "varint_of",
]

VARINT, FIXED64, BYTES, GROUP_START, GROUP_END, FIXED32 = 0, 1, 2, 3, 4, 5
MAX_FIELD_NUMBER = (1 << 29) - 1
"""The largest field number protobuf allows; every tag above it is refused."""
_MAX_VARINT_BYTES = 10
_UINT64 = 1 << 64
_TAG_LIMIT = (MAX_FIELD_NUMBER + 1) << 3
"""The first tag whose field number is past the maximum (2**32: past it, Go's int32 reading
keeps only the low 32 bits)."""


class ProtobufProblem(Enum):
    """Why a body was refused, as far as the apiserver's own decoding is concerned."""

    MALFORMED = "malformed"
    """Go's generated code fails on it too: the apiserver's own error may be passed on."""
    AMBIGUOUS = "ambiguous"
    """Go's generated code may read a value from it that the gatekeeper does not (an aliased
    field number, a repeated field it merges, bits it drops): refused before anything is
    asked of the apiserver."""


class ProtobufError(ValueError):
    """A body that is not a well-formed, unambiguous Kubernetes protobuf message."""

    def __init__(self, message: str, problem: ProtobufProblem = ProtobufProblem.MALFORMED):
        super().__init__(message)
        self.problem = problem


def _ambiguous(message: str) -> ProtobufError:
    return ProtobufError(message, ProtobufProblem.AMBIGUOUS)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a message, by position in the message's bytes."""

    number: int
    wire_type: int
    start: int
    """Where the field's tag starts."""
    value_start: int
    end: int
    """One past its last byte."""


def _varint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it. Go reads at most 10 bytes (more is
    its integer overflow) into a uint64, dropping bits past 64: such a value is refused."""
    if pos < len(data) and data[pos] < 0x80:
        return data[pos], pos + 1  # the common one-byte varint
    value = shift = 0
    for index in range(pos, min(pos + _MAX_VARINT_BYTES, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value >= _UINT64:
                raise _ambiguous(f"{what}: a varint wider than 64 bits (the apiserver drops bits)")
            return value, index + 1
        shift += 7
    if pos + _MAX_VARINT_BYTES <= len(data):
        raise ProtobufError(f"{what}: a varint longer than {_MAX_VARINT_BYTES} bytes")
    raise ProtobufError(f"{what}: truncated varint")


def _go_field_number(tag: int) -> int:
    """The field number Go's generated code reads from ``tag``: ``int32(uint64(tag) >> 3)``."""
    number = ((tag % _UINT64) >> 3) & 0xFFFFFFFF
    return number - (1 << 32) if number >= 1 << 31 else number


def _tag(data: bytes, pos: int, what: str) -> tuple[int, int, int]:
    """The field number, wire type and value position of the tag at ``pos``."""
    tag = data[pos]
    if tag < 0x80:  # the common one-byte tag: fields 1 to 15
        after = pos + 1
    else:
        tag, after = _varint(data, pos, what)
    number, wire_type = tag >> 3, tag & 7
    if tag >= _TAG_LIMIT:
        # SECURITY: DESIGN §4.4 — field 1 + 2**32 is metadata to the apiserver: a hidden second
        # ObjectMeta (resourceVersion "") would make a pinned update unconditional.
        above = f"{what}: field number {number} is above the protobuf maximum {MAX_FIELD_NUMBER}"
        if (go_number := _go_field_number(tag)) <= 0:
            raise ProtobufError(f"{above} (the apiserver refuses this tag too)")
        raise _ambiguous(f"{above} (the apiserver reads this tag as field {go_number})")
    if number == 0:
        raise ProtobufError(f"{what}: field number 0")
    if wire_type == GROUP_START:
        # Go skips a group in a field it does not know; the gatekeeper does not read groups.
        raise _ambiguous(f"{what}: field {number} is a group (wire type 3), which is not read")
    if wire_type not in (VARINT, FIXED64, BYTES, FIXED32):
        raise ProtobufError(f"{what}: unsupported wire type {wire_type} (field {number})")
    return number, wire_type, after


def fields(data: bytes, what: str) -> Iterator[Field]:
    """The fields of one message (``what`` names it in errors), in order; every tag and length
    checked, so a message iterated to its end is well-formed; ProtobufError otherwise."""
    pos = 0
    while pos < len(data):
        start = pos
        number, wire_type, pos = _tag(data, pos, what)
        if wire_type == VARINT:
            value_start = pos
            _, end = _varint(data, pos, f"{what} field {number}")
        elif wire_type == BYTES:
            length, value_start = _varint(data, pos, f"{what} field {number} length")
            end = value_start + length
        else:
            value_start = pos
            end = pos + (8 if wire_type == FIXED64 else 4)
        if end > len(data):
            raise ProtobufError(f"{what}: field {number} runs past the end of the message")
        yield Field(number, wire_type, start, value_start, end)
        pos = end


def unique_fields(data: bytes, what: str, numbers: frozenset[int]) -> dict[int, Field]:
    """The fields of ``data`` by number (the first of each); refused when one of ``numbers``
    occurs twice: Go merges or overwrites repeated occurrences, so one reading of them could
    differ from the apiserver's (DESIGN §4.4: one canonical form)."""
    seen: dict[int, Field] = {}
    for item in fields(data, what):
        if item.number in numbers and item.number in seen:
            raise _ambiguous(f"{what} field {item.number} occurs more than once")
        seen.setdefault(item.number, item)
    return seen


def bytes_of(data: bytes, item: Field | None, what: str) -> bytes:
    """The payload of a length-delimited field (empty when absent)."""
    if item is None:
        return b""
    if item.wire_type != BYTES:
        raise ProtobufError(f"{what} is not a length-delimited field")
    return data[item.value_start : item.end]


def string_of(data: bytes, item: Field | None, what: str) -> str:
    """A string field (empty when absent). Go keeps any bytes; the gatekeeper only UTF-8."""
    try:
        return bytes_of(data, item, what).decode("utf-8")
    except UnicodeDecodeError:
        raise _ambiguous(f"{what} is not UTF-8") from None


def varint_of(data: bytes, item: Field, what: str) -> int:
    """A varint field's value as a uint64."""
    if item.wire_type != VARINT:
        raise ProtobufError(f"{what} is not a varint")
    value, _ = _varint(data, item.value_start, what)
    return value


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def length_delimited(number: int, value: bytes) -> bytes:
    """Field ``number`` holding ``value``, encoded as Go encodes it (minimal varints)."""
    return _encode_varint(number << 3 | BYTES) + _encode_varint(len(value)) + value


def replace_field(
    data: bytes, what: str, number: int, value: bytes, *, first: bool = False
) -> bytes:
    """``data`` with field ``number`` (at most once, checked by the caller) set to ``value``:
    in place when present, else appended (or prepended when ``first``)."""
    encoded = length_delimited(number, value)
    for item in fields(data, what):
        if item.number == number:
            return data[: item.start] + encoded + data[item.end :]
    return encoded + data if first else data + encoded
