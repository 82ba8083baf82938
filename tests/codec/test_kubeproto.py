"""The protobuf wire reader: envelope facts, the resourceVersion pin, DeleteOptions, and the
ambiguous or malformed encodings it refuses."""

from __future__ import annotations

import pytest

from gatekeeper.codec.kubeproto import (
    MAGIC,
    ProtobufError,
    delete_options,
    read_envelope,
    with_resource_version,
)


def varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: bytes | str) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def number(field_number: int, value: int) -> bytes:
    return varint(field_number << 3) + varint(value)


def body(meta: bytes, *, rest: bytes = b"", api: str = "resource.k8s.io/v1") -> bytes:
    """``k8s\\0`` + Unknown{typeMeta, raw = object{metadata = meta, rest}}, as gogo writes it
    (empty contentEncoding and contentType included)."""
    type_meta = field(1, api) + field(2, "ResourceSlice")
    raw = field(1, meta) + rest
    return MAGIC + field(1, type_meta) + field(2, raw) + field(3, "") + field(4, "")


SPEC = field(2, field(1, "gpu.example.com") + field(2, "node-a"))
META = field(1, "s1") + field(2, "") + field(3, "") + field(6, "") + field(11, field(1, "k"))


def test_envelope_facts() -> None:
    envelope = read_envelope(body(META.replace(field(6, ""), field(6, "42")), rest=SPEC))
    assert (envelope.api_version, envelope.kind) == ("resource.k8s.io/v1", "ResourceSlice")
    assert (envelope.name, envelope.namespace, envelope.resource_version) == ("s1", "", "42")


def test_pin_changes_only_the_resource_version() -> None:
    original = body(META, rest=SPEC)
    pinned = with_resource_version(original, "1234")
    assert read_envelope(pinned).resource_version == "1234"
    assert with_resource_version(pinned, "") == original  # the edit is the one field, in place
    assert pinned.endswith(SPEC + field(3, "") + field(4, ""))


def test_pin_adds_the_field_when_absent() -> None:
    pinned = with_resource_version(body(field(1, "s1"), rest=SPEC), "7")
    assert read_envelope(pinned).resource_version == "7"
    assert read_envelope(pinned).name == "s1"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\n\x03foo", "does not appear to be a protobuf message"),
        (MAGIC + b"\n\xff\xff\xffgarbage", "runs past the end"),
        (MAGIC + b"\x0b", "unsupported wire type 3"),
        (body(META) + field(2, b""), "envelope field 2 occurs more than once"),
        (body(META, rest=field(1, META)), "object field 1 occurs more than once"),
        (body(META + field(6, "9")), "metadata field 6 occurs more than once"),
        (body(META)[: -len(field(3, "") + field(4, ""))] + field(3, "gzip"), "compressed"),
        (MAGIC + b"\x80" * 11, "varint"),
    ],
)
def test_ambiguous_or_malformed_bodies_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ProtobufError, match=message):
        read_envelope(data)
    with pytest.raises(ProtobufError):
        with_resource_version(data, "1")


def delete_body(raw: bytes) -> bytes:
    type_meta = field(1, "resource.k8s.io/v1") + field(2, "DeleteOptions")
    return MAGIC + field(1, type_meta) + field(2, raw) + field(3, "") + field(4, "")


def test_delete_options_as_client_go_sends_them() -> None:
    raw = (
        number(1, -1)
        + field(2, field(1, "uid-1") + field(2, "659"))
        + number(3, 0)
        + field(4, "Background")
        + field(5, "All")
        + number(6, 1)
    )
    assert delete_options(delete_body(raw)) == {
        "kind": "DeleteOptions",
        "apiVersion": "resource.k8s.io/v1",
        "gracePeriodSeconds": -1,
        "preconditions": {"uid": "uid-1", "resourceVersion": "659"},
        "orphanDependents": False,
        "propagationPolicy": "Background",
        "dryRun": ["All"],
        "ignoreStoreReadErrorWithClusterBreakingPotential": True,
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (number(9, 1), "DeleteOptions has no field 9"),
        (field(4, "Orphan") + field(4, "Background"), "field 4 occurs more than once"),
        (field(2, field(3, "x")), "Preconditions has no field 3"),
        (number(3, 2), "orphanDependents is not a bool"),
        (field(1, "10"), "gracePeriodSeconds is not a varint"),
    ],
)
def test_delete_options_the_gatekeeper_cannot_read_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(ProtobufError, match=message):
        delete_options(delete_body(raw))
