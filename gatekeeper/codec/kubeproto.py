"""Kubernetes protobuf bodies at the wire level: the envelope, ObjectMeta's resourceVersion, and
meta/v1 DeleteOptions — no API type of any group is compiled in.

A body is ``k8s\\x00`` followed by a ``runtime.Unknown`` (typeMeta = 1 {apiVersion = 1,
kind = 2}, raw = 2, contentEncoding = 3, contentType = 4). ObjectMeta is field 1 of every
built-in object and resourceVersion is field 6 of ObjectMeta: these numbers belong to
apimachinery's meta/v1 and are the same for every kind and version, so the gatekeeper reads and
pins them without knowing the kind. Everything else about the object is decoded by the
apiserver (a dry run); see :mod:`gatekeeper.request.encoded`.

Ambiguous encodings are refused: a repeated envelope field, a repeated ObjectMeta or a repeated
resourceVersion would let the gatekeeper's reading and the apiserver's merge of the occurrences
differ (DESIGN §4.4: decide and forward one canonical form).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "MAGIC",
    "PROTOBUF",
    "Envelope",
    "ProtobufError",
    "delete_options",
    "read_envelope",
    "with_resource_version",
]

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_TYPE_META, _RAW, _CONTENT_ENCODING, _CONTENT_TYPE = 1, 2, 3, 4
_OBJECT_META = 1
_META_NAME, _META_NAMESPACE, _META_RESOURCE_VERSION = 1, 3, 6
_MAX_VARINT_BYTES = 10


class ProtobufError(ValueError):
    """A body that is not a well-formed, unambiguous Kubernetes protobuf message."""


@dataclass(frozen=True, slots=True)
class _Field:
    number: int
    wire_type: int
    start: int
    """Where the field's tag starts."""
    value_start: int
    end: int
    """One past its last byte."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for index in range(pos, min(pos + _MAX_VARINT_BYTES, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, index + 1
        shift += 7
    raise ProtobufError("truncated or overlong varint")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(data: bytes) -> Iterator[_Field]:
    """The fields of one message, in order; ProtobufError on anything malformed."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise ProtobufError("field number 0")
        if wire_type == _VARINT:
            _, end = _varint(data, pos)
            value_start = pos
        elif wire_type == _BYTES:
            length, value_start = _varint(data, pos)
            end = value_start + length
        elif wire_type == _FIXED64:
            value_start, end = pos, pos + 8
        elif wire_type == _FIXED32:
            value_start, end = pos, pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire_type} (field {number})")
        if end > len(data):
            raise ProtobufError(f"field {number} runs past the end of the message")
        yield _Field(number, wire_type, start, value_start, end)
        pos = end


def _unique(data: bytes, what: str, numbers: frozenset[int]) -> dict[int, _Field]:
    """The fields of ``data`` by number; 400 when one of ``numbers`` occurs twice."""
    seen: dict[int, _Field] = {}
    for item in _fields(data):
        if item.number in numbers and item.number in seen:
            raise ProtobufError(f"{what} field {item.number} occurs more than once")
        seen.setdefault(item.number, item)
    return seen


def _string(data: bytes, item: _Field | None, what: str) -> str:
    if item is None:
        return ""
    if item.wire_type != _BYTES:
        raise ProtobufError(f"{what} is not a length-delimited field")
    try:
        return data[item.value_start : item.end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtobufError(f"{what} is not UTF-8") from exc


@dataclass(frozen=True, slots=True)
class Envelope:
    """What the gatekeeper reads of a protobuf object body without knowing its type."""

    api_version: str
    kind: str
    name: str
    namespace: str
    resource_version: str


def _unknown(body: bytes) -> tuple[bytes, dict[int, _Field]]:
    if not body.startswith(MAGIC):
        raise ProtobufError(
            f"provided data does not appear to be a protobuf message, expected prefix {list(MAGIC)}"
        )
    unknown = body[len(MAGIC) :]
    return unknown, _unique(
        unknown, "envelope", frozenset({_TYPE_META, _RAW, _CONTENT_ENCODING, _CONTENT_TYPE})
    )


def _bytes_of(data: bytes, item: _Field | None, what: str) -> bytes:
    if item is None:
        return b""
    if item.wire_type != _BYTES:
        raise ProtobufError(f"{what} is not a length-delimited field")
    return data[item.value_start : item.end]


def read_envelope(body: bytes) -> Envelope:
    """The type and identity of a protobuf object body; ProtobufError when malformed."""
    unknown, fields = _unknown(body)
    type_meta = _bytes_of(unknown, fields.get(_TYPE_META), "typeMeta")
    meta_fields = _unique(type_meta, "typeMeta", frozenset({1, 2}))
    if _string(unknown, fields.get(_CONTENT_ENCODING), "contentEncoding"):
        raise ProtobufError("an encoded (compressed) protobuf envelope is not accepted")
    raw = _bytes_of(unknown, fields.get(_RAW), "raw")
    object_fields = _unique(raw, "object", frozenset({_OBJECT_META}))
    meta = _bytes_of(raw, object_fields.get(_OBJECT_META), "metadata")
    meta_by_number = _unique(
        meta, "metadata", frozenset({_META_NAME, _META_NAMESPACE, _META_RESOURCE_VERSION})
    )
    return Envelope(
        api_version=_string(type_meta, meta_fields.get(1), "apiVersion"),
        kind=_string(type_meta, meta_fields.get(2), "kind"),
        name=_string(meta, meta_by_number.get(_META_NAME), "metadata.name"),
        namespace=_string(meta, meta_by_number.get(_META_NAMESPACE), "metadata.namespace"),
        resource_version=_string(
            meta, meta_by_number.get(_META_RESOURCE_VERSION), "metadata.resourceVersion"
        ),
    )


def _length_delimited(number: int, value: bytes) -> bytes:
    return _encode_varint(number << 3 | _BYTES) + _encode_varint(len(value)) + value


def _replace_field(data: bytes, number: int, value: bytes, *, first: bool = False) -> bytes:
    """``data`` with field ``number`` (at most once, checked by the caller) set to ``value``:
    in place when present, else appended (or prepended when ``first``)."""
    encoded = _length_delimited(number, value)
    for item in _fields(data):
        if item.number == number:
            return data[: item.start] + encoded + data[item.end :]
    return encoded + data if first else data + encoded


def with_resource_version(body: bytes, resource_version: str) -> bytes:
    """``body`` with ``metadata.resourceVersion`` set: the rest of the bytes are kept as sent."""
    read_envelope(body)  # well-formed and unambiguous, or ProtobufError
    unknown, fields = _unknown(body)
    raw_field = fields[_RAW]
    raw = unknown[raw_field.value_start : raw_field.end]
    object_meta = next((f for f in _fields(raw) if f.number == _OBJECT_META), None)
    meta = b"" if object_meta is None else raw[object_meta.value_start : object_meta.end]
    meta = _replace_field(meta, _META_RESOURCE_VERSION, resource_version.encode())
    raw = _replace_field(raw, _OBJECT_META, meta, first=True)
    return MAGIC + _replace_field(unknown, _RAW, raw)


# --- meta/v1 DeleteOptions ----------------------------------------------------------------------

_DELETE_OPTION_FIELDS = frozenset({1, 2, 3, 4, 5, 6})


def _int64(data: bytes, item: _Field, what: str) -> int:
    if item.wire_type != _VARINT:
        raise ProtobufError(f"{what} is not a varint")
    value, _ = _varint(data, item.value_start)
    return value - (1 << 64) if value >= 1 << 63 else value


def _bool(data: bytes, item: _Field, what: str) -> bool:
    value = _int64(data, item, what)
    if value not in (0, 1):
        raise ProtobufError(f"{what} is not a bool")
    return value == 1


def delete_options(body: bytes) -> dict[str, object]:
    """A protobuf DeleteOptions body as the JSON DeleteOptions it stands for.

    The message is meta/v1's (gracePeriodSeconds = 1, preconditions = 2 {uid = 1,
    resourceVersion = 2}, orphanDependents = 3, propagationPolicy = 4, dryRun = 5,
    ignoreStoreReadErrorWithClusterBreakingPotential = 6). An unknown field is refused: an
    option the gatekeeper cannot read could change what the delete does.
    """
    unknown, fields = _unknown(body)
    type_meta = _bytes_of(unknown, fields.get(_TYPE_META), "typeMeta")
    type_fields = _unique(type_meta, "typeMeta", frozenset({1, 2}))
    raw = _bytes_of(unknown, fields.get(_RAW), "raw")
    options: dict[str, object] = {
        "kind": _string(type_meta, type_fields.get(2), "kind") or "DeleteOptions",
        "apiVersion": _string(type_meta, type_fields.get(1), "apiVersion") or "meta.k8s.io/v1",
    }
    dry_run: list[str] = []
    seen: set[int] = set()
    for item in _fields(raw):
        if item.number not in _DELETE_OPTION_FIELDS:
            raise ProtobufError(f"DeleteOptions has no field {item.number}")
        if item.number != 5 and item.number in seen:
            raise ProtobufError(f"DeleteOptions field {item.number} occurs more than once")
        seen.add(item.number)
        if item.number == 1:
            options["gracePeriodSeconds"] = _int64(raw, item, "gracePeriodSeconds")
        elif item.number == 2:
            options["preconditions"] = _preconditions(_bytes_of(raw, item, "preconditions"))
        elif item.number == 3:
            options["orphanDependents"] = _bool(raw, item, "orphanDependents")
        elif item.number == 4:
            options["propagationPolicy"] = _string(raw, item, "propagationPolicy")
        elif item.number == 5:
            dry_run.append(_string(raw, item, "dryRun"))
        else:
            options["ignoreStoreReadErrorWithClusterBreakingPotential"] = _bool(
                raw, item, "ignoreStoreReadErrorWithClusterBreakingPotential"
            )
    if dry_run:
        options["dryRun"] = dry_run
    return options


def _preconditions(data: bytes) -> dict[str, str]:
    preconditions: dict[str, str] = {}
    for item in _fields(data):
        if item.number not in (1, 2):
            raise ProtobufError(f"Preconditions has no field {item.number}")
        key = "uid" if item.number == 1 else "resourceVersion"
        if key in preconditions:
            raise ProtobufError(f"Preconditions field {item.number} occurs more than once")
        preconditions[key] = _string(data, item, f"preconditions.{key}")
    return preconditions
