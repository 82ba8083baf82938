"""Kubernetes protobuf bodies at the wire level: the envelope, ObjectMeta's resourceVersion, and
meta/v1 DeleteOptions — no API type of any group is compiled in.

A body is ``k8s\\x00`` followed by a ``runtime.Unknown`` (typeMeta = 1 {apiVersion = 1,
kind = 2}, raw = 2, contentEncoding = 3, contentType = 4). ObjectMeta is field 1 of every
built-in object and resourceVersion is field 6 of ObjectMeta: these numbers belong to
apimachinery's meta/v1 and are the same for every kind and version, so the gatekeeper reads and
pins them without knowing the kind. Everything else about the object is decoded by the
apiserver (a dry run); see :mod:`gatekeeper.request.encoded`.

Every message read here is read as the apiserver's generated code reads it, or refused
(:mod:`gatekeeper.codec.protowire`). Ambiguous encodings are refused: a repeated envelope
field, a repeated ObjectMeta or a repeated resourceVersion would let the gatekeeper's reading and
the apiserver's merge of the occurrences differ (DESIGN §4.4: decide and forward one canonical
form).
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.codec.protowire import (
    BYTES,
    Field,
    ProtobufError,
    ProtobufProblem,
    bytes_of,
    fields,
    replace_field,
    string_of,
    unique_fields,
    varint_of,
)

__all__ = [
    "MAGIC",
    "PROTOBUF",
    "Envelope",
    "ProtobufError",
    "ProtobufProblem",
    "delete_options",
    "read_envelope",
    "with_resource_version",
    "without_maintained_fields",
]

MAGIC = b"k8s\x00"
PROTOBUF = "application/vnd.kubernetes.protobuf"

_TYPE_META, _RAW, _CONTENT_ENCODING, _CONTENT_TYPE = 1, 2, 3, 4
_API_VERSION, _KIND = 1, 2
_OBJECT_META = 1
_META_NAME, _META_NAMESPACE, _META_RESOURCE_VERSION = 1, 3, 6
_META_MAPS = {11: "metadata.labels", 12: "metadata.annotations"}
# ObjectMeta's generation (7) and managedFields (17): kept from a body by the apiserver (a create's
# generation; managedFields that are not empty), though only the apiserver maintains them.
_META_MAINTAINED = frozenset({7, 17})
_MAP_KEY, _MAP_VALUE = 1, 2
_ENVELOPE_FIELDS = frozenset({_TYPE_META, _RAW, _CONTENT_ENCODING, _CONTENT_TYPE})
_TYPE_META_FIELDS = frozenset({_API_VERSION, _KIND})
_META_FIELDS = frozenset({_META_NAME, _META_NAMESPACE, _META_RESOURCE_VERSION})
_AMBIGUOUS = ProtobufProblem.AMBIGUOUS


@dataclass(frozen=True, slots=True)
class Envelope:
    """What the gatekeeper reads of a protobuf object body without knowing its type."""

    api_version: str
    kind: str
    name: str
    namespace: str
    resource_version: str


def _unknown(body: bytes) -> tuple[bytes, bytes, bytes]:
    """The envelope (after the magic), its typeMeta and its raw object, every field checked."""
    if not body.startswith(MAGIC):
        raise ProtobufError(
            f"provided data does not appear to be a protobuf message, expected prefix {list(MAGIC)}"
        )
    unknown = body[len(MAGIC) :]
    by_number = unique_fields(unknown, "envelope", _ENVELOPE_FIELDS)
    type_meta = bytes_of(unknown, by_number.get(_TYPE_META), "typeMeta")
    if string_of(unknown, by_number.get(_CONTENT_ENCODING), "contentEncoding"):
        # The apiserver ignores contentEncoding and reads raw as it is; a sender that sets it
        # means something else by the bytes than the apiserver will read.
        raise ProtobufError("an encoded (compressed) protobuf envelope is not accepted", _AMBIGUOUS)
    bytes_of(unknown, by_number.get(_CONTENT_TYPE), "contentType")  # any bytes, as Go reads it
    return unknown, type_meta, bytes_of(unknown, by_number.get(_RAW), "raw")


def _type_meta(type_meta: bytes) -> tuple[str, str]:
    """typeMeta's apiVersion and kind."""
    by_number = unique_fields(type_meta, "typeMeta", _TYPE_META_FIELDS)
    return (
        string_of(type_meta, by_number.get(_API_VERSION), "apiVersion"),
        string_of(type_meta, by_number.get(_KIND), "kind"),
    )


def _object_meta(raw: bytes) -> bytes:
    """The object's ObjectMeta (field 1; empty when absent), every top-level field checked."""
    object_fields = unique_fields(raw, "object", frozenset({_OBJECT_META}))
    return bytes_of(raw, object_fields.get(_OBJECT_META), "metadata")


def read_envelope(body: bytes) -> Envelope:
    """The type and identity of a protobuf object body; ProtobufError when malformed or when
    the apiserver could read it differently."""
    _, type_meta, raw = _unknown(body)
    api_version, kind = _type_meta(type_meta)
    meta = _object_meta(raw)
    by_number = unique_fields(meta, "metadata", _META_FIELDS)
    _check_map_entries(meta)
    return Envelope(
        api_version=api_version,
        kind=kind,
        name=string_of(meta, by_number.get(_META_NAME), "metadata.name"),
        namespace=string_of(meta, by_number.get(_META_NAMESPACE), "metadata.namespace"),
        resource_version=string_of(
            meta, by_number.get(_META_RESOURCE_VERSION), "metadata.resourceVersion"
        ),
    )


def _check_map_entries(meta: bytes) -> None:
    """Refuse a labels or annotations entry that Go could read past its end.

    Go's generated code reads a map entry's key and value as strings whatever their wire type,
    bounded by the end of ObjectMeta rather than of the entry: such a string runs on into the
    fields after it, resourceVersion included, so pinning it would change the labels the
    apiserver reads along with it (DESIGN §4.4: one canonical form). An entry is accepted only
    when each of its fields ends inside it and its key and value are length-delimited."""
    for item in fields(meta, "metadata"):
        if (what := _META_MAPS.get(item.number)) is None or item.wire_type != BYTES:
            continue
        try:
            for part in fields(meta[item.value_start : item.end], f"{what} entry"):
                if part.number in (_MAP_KEY, _MAP_VALUE) and part.wire_type != BYTES:
                    raise ProtobufError(
                        f"{what} entry: field {part.number} has wire type {part.wire_type}"
                    )
        except ProtobufError as error:
            raise ProtobufError(
                f"{error} (the apiserver reads a map entry's key and value as strings that may "
                "run past the entry)",
                _AMBIGUOUS,
            ) from None


def with_resource_version(body: bytes, resource_version: str) -> bytes:
    """``body`` with ``metadata.resourceVersion`` set: the rest of the bytes are kept as sent
    (an absent object or ObjectMeta is added, as Go would read an empty one)."""
    read_envelope(body)  # well-formed and unambiguous, or ProtobufError
    unknown, _, raw = _unknown(body)
    meta = _object_meta(raw)
    meta = replace_field(meta, "metadata", _META_RESOURCE_VERSION, resource_version.encode())
    raw = replace_field(raw, "object", _OBJECT_META, meta, first=True)
    return MAGIC + replace_field(unknown, "envelope", _RAW, raw)


def without_maintained_fields(body: bytes) -> bytes:
    """``body`` without ObjectMeta's generation and managedFields, every other byte as sent (the
    same bytes when it has neither): the apiserver then keeps its own (an update's stored
    managedFields, a create's new ones), as it does for a body that leaves them out."""
    read_envelope(body)  # well-formed and unambiguous, or ProtobufError
    unknown, _, raw = _unknown(body)
    meta = _object_meta(raw)
    kept = b"".join(
        meta[item.start : item.end]
        for item in fields(meta, "metadata")
        if item.number not in _META_MAINTAINED
    )
    if kept == meta:
        return body
    raw = replace_field(raw, "object", _OBJECT_META, kept, first=True)
    return MAGIC + replace_field(unknown, "envelope", _RAW, raw)


# --- meta/v1 DeleteOptions ----------------------------------------------------------------------

_GRACE, _PRECONDITIONS, _ORPHAN, _PROPAGATION, _DRY_RUN, _IGNORE_READ_ERROR = 1, 2, 3, 4, 5, 6
_OPTION_NAMES = {
    _GRACE: "gracePeriodSeconds",
    _PRECONDITIONS: "preconditions",
    _ORPHAN: "orphanDependents",
    _PROPAGATION: "propagationPolicy",
    _DRY_RUN: "dryRun",
    _IGNORE_READ_ERROR: "ignoreStoreReadErrorWithClusterBreakingPotential",
}


def _int64(data: bytes, item: Field, what: str) -> int:
    value = varint_of(data, item, what)
    return value - (1 << 64) if value >= 1 << 63 else value


def _bool(data: bytes, item: Field, what: str) -> bool:
    value = varint_of(data, item, what)
    if value not in (0, 1):
        # Go reads every value but 0 as true; only the two canonical ones are accepted.
        raise ProtobufError(f"{what} is not a bool", ProtobufProblem.AMBIGUOUS)
    return value == 1


def delete_options(body: bytes) -> dict[str, object]:
    """A protobuf DeleteOptions body as the JSON DeleteOptions it stands for.

    The message is meta/v1's (gracePeriodSeconds = 1, preconditions = 2 {uid = 1,
    resourceVersion = 2}, orphanDependents = 3, propagationPolicy = 4, dryRun = 5,
    ignoreStoreReadErrorWithClusterBreakingPotential = 6). An unknown field is refused: an
    option the gatekeeper cannot read could change what the delete does.
    """
    _, type_meta, raw = _unknown(body)
    api_version, kind = _type_meta(type_meta)
    options: dict[str, object] = {
        "kind": kind or "DeleteOptions",
        "apiVersion": api_version or "meta.k8s.io/v1",
    }
    dry_run: list[str] = []
    for item in fields(raw, "DeleteOptions"):
        name = _OPTION_NAMES.get(item.number)
        if name is None:
            raise ProtobufError(f"DeleteOptions has no field {item.number}", _AMBIGUOUS)
        if item.number != _DRY_RUN and name in options:
            raise ProtobufError(
                f"DeleteOptions field {item.number} occurs more than once", _AMBIGUOUS
            )
        if item.number == _GRACE:
            options[name] = _int64(raw, item, name)
        elif item.number == _PRECONDITIONS:
            options[name] = _preconditions(bytes_of(raw, item, name))
        elif item.number in (_ORPHAN, _IGNORE_READ_ERROR):
            options[name] = _bool(raw, item, name)
        elif item.number == _PROPAGATION:
            options[name] = string_of(raw, item, name)
        else:
            dry_run.append(string_of(raw, item, name))
    if dry_run:
        options["dryRun"] = dry_run
    return options


def _preconditions(data: bytes) -> dict[str, str]:
    preconditions: dict[str, str] = {}
    for item in fields(data, "preconditions"):
        if item.number not in (1, 2):
            raise ProtobufError(f"Preconditions has no field {item.number}", _AMBIGUOUS)
        key = "uid" if item.number == 1 else "resourceVersion"
        if key in preconditions:
            raise ProtobufError(
                f"Preconditions field {item.number} occurs more than once", _AMBIGUOUS
            )
        preconditions[key] = string_of(data, item, f"preconditions.{key}")
    return preconditions
