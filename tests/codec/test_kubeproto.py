"""The protobuf wire reader: envelope facts, the resourceVersion pin, DeleteOptions, the
ambiguous or malformed encodings it refuses, and the corpus of bodies it once read differently
from the kube-apiserver (tests/corpus/protobuf, replayed against Go in the real tier)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gatekeeper.codec.kubeproto import (
    MAGIC,
    ProtobufError,
    ProtobufProblem,
    delete_options,
    read_envelope,
    with_resource_version,
)
from gatekeeper.testing.protobuf import envelope, field, number, varint, wide

MALFORMED, AMBIGUOUS = ProtobufProblem.MALFORMED, ProtobufProblem.AMBIGUOUS
CORPUS = Path(__file__).parents[1] / "corpus" / "protobuf" / "divergences.yaml"
ALIAS = 1 << 32
"""Go reads a field number's low 32 bits: field n + ALIAS is field n to the apiserver."""


# The writers, shared with the real tier's tests and the benchmark; ``body`` is the envelope.
body = envelope


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
    ("data", "message", "problem"),
    [
        (b"\n\x03foo", "does not appear to be a protobuf message", MALFORMED),
        (MAGIC + b"\n\xff\xff\xffgarbage", "runs past the end", MALFORMED),
        (MAGIC + b"\x0b", "field 1 is a group", AMBIGUOUS),
        (MAGIC + b"\x0c", "unsupported wire type 4", MALFORMED),
        (MAGIC + b"\x0f", "unsupported wire type 7", MALFORMED),
        (MAGIC + b"\x02\x00", "field number 0", MALFORMED),
        (body(META) + field(2, b""), "envelope field 2 occurs more than once", AMBIGUOUS),
        (body(META, rest=field(1, META)), "object field 1 occurs more than once", AMBIGUOUS),
        (body(META + field(6, "9")), "metadata field 6 occurs more than once", AMBIGUOUS),
        (
            body(META)[: -len(field(3, "") + field(4, ""))] + field(3, "gzip"),
            "compressed",
            AMBIGUOUS,
        ),
        (MAGIC + b"\x80" * 11, "longer than 10 bytes", MALFORMED),
        (MAGIC + b"\x80" * 9, "truncated varint", MALFORMED),
        (
            body(META.replace(field(1, "s1"), field(1, b"\xff"))),
            "metadata.name is not UTF-8",
            AMBIGUOUS,
        ),
        (
            body(META) + varint(4 << 3) + wide(1, 1),
            "envelope field 4: a varint wider than 64",
            AMBIGUOUS,
        ),
        (body(META) + wide(1 << 3 | 2, 1) + b"\x00", "envelope: a varint wider than 64", AMBIGUOUS),
        (body(META) + varint(3 << 3 | 2) + wide(0, 1), "length: a varint wider than 64", AMBIGUOUS),
        (
            MAGIC + field(1, b"") + varint(2 << 3) + b"\x01",
            "raw is not a length-delimited",
            MALFORMED,
        ),
        # A map entry's key or value that Go reads as a string running past the entry, into
        # the fields after it (resourceVersion among them): pinning would change the labels.
        (
            body(META + field(12, varint(2 << 3) + b"\x05")),
            "metadata.annotations entry: field 2 has wire type 0",
            AMBIGUOUS,
        ),
        (
            body(field(11, field(1, "k") + varint(2 << 3 | 2) + b"\x09") + META),
            "metadata.labels entry: field 2 runs past the end",
            AMBIGUOUS,
        ),
        (
            body(field(11, b"\x13\x34") + META),
            "metadata.labels entry: field 2 is a group",
            AMBIGUOUS,
        ),
    ],
)
def test_ambiguous_or_malformed_bodies_are_refused(
    data: bytes, message: str, problem: ProtobufProblem
) -> None:
    with pytest.raises(ProtobufError, match=message) as refused:
        read_envelope(data)
    assert refused.value.problem is problem
    with pytest.raises(ProtobufError):
        with_resource_version(data, "1")


@pytest.mark.parametrize(
    ("where", "number", "apiserver", "problem"),
    [
        ("object", 1 + ALIAS, "reads this tag as field 1", AMBIGUOUS),  # a second ObjectMeta
        ("object", 1 + 8 * ALIAS, "reads this tag as field 1", AMBIGUOUS),  # + 2**35
        ("metadata", 6 + ALIAS, "reads this tag as field 6", AMBIGUOUS),
        ("metadata", 1 << 29, "reads this tag as field 536870912", AMBIGUOUS),  # an unknown field
        ("metadata", (1 << 31) + 6, "refuses this tag too", MALFORMED),  # negative as int32
        ("metadata", 1 << 32, "refuses this tag too", MALFORMED),  # 0 as int32
        ("envelope", 2 + ALIAS, "reads this tag as field 2", AMBIGUOUS),
        ("typeMeta", 2 + ALIAS, "reads this tag as field 2", AMBIGUOUS),
    ],
)
def test_field_numbers_past_the_protobuf_maximum_are_refused(
    where: str, number: int, apiserver: str, problem: ProtobufProblem
) -> None:
    hidden = field(number, field(6, "") if where == "object" else "x")
    extra = {where: hidden}
    data = body(
        META + extra.get("metadata", b""),
        rest=SPEC + extra.get("object", b""),
        type_meta_extra=extra.get("typeMeta", b""),
    )
    data += extra.get("envelope", b"")
    with pytest.raises(ProtobufError) as refused:
        read_envelope(data)
    assert str(refused.value) == (
        f"{where}: field number {number} is above the protobuf maximum 536870911 "
        f"(the apiserver {apiserver})"
    )
    assert refused.value.problem is problem


def test_the_largest_field_number_is_an_unknown_field() -> None:
    """2**29 - 1 is a field number both readers read alike: Go skips it, so does the gatekeeper."""
    data = body(META + field((1 << 29) - 1, "x"), rest=SPEC)
    assert read_envelope(data).name == "s1"
    assert read_envelope(with_resource_version(data, "3")).resource_version == "3"


def test_an_overlong_tag_is_read_at_its_value() -> None:
    """A tag padded with continuation bytes (at most 10 in all) is the same tag to Go."""
    padded_name = b"\x8a\x80\x80\x80\x80\x80\x80\x80\x80\x00" + varint(2) + b"s9"
    data = body(padded_name, rest=SPEC)
    assert read_envelope(data).name == "s9"
    with pytest.raises(ProtobufError, match="longer than 10 bytes"):
        read_envelope(body(b"\x8a" + b"\x80" * 9 + b"\x00" + varint(2) + b"s9"))


def test_pin_adds_the_object_when_absent() -> None:
    data = MAGIC + field(1, field(1, "resource.k8s.io/v1") + field(2, "ResourceSlice"))
    pinned = with_resource_version(data, "8")
    assert read_envelope(pinned).resource_version == "8"
    assert pinned.startswith(data)


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
        (varint(1 << 3) + wide(5, 3), "DeleteOptions field 1: a varint wider than 64 bits"),
        (field(2 + ALIAS, field(2, "")), "DeleteOptions: field number 4294967298"),
        (field(2, field(2 + ALIAS, "")), "preconditions: field number 4294967298"),
        (field(2, field(1, "a")) + field(2, field(2, "b")), "field 2 occurs more than once"),
    ],
)
def test_delete_options_the_gatekeeper_cannot_read_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(ProtobufError, match=message):
        delete_options(delete_body(raw))


def test_delete_options_past_64_bits_in_the_envelope_are_refused() -> None:
    aliased_raw = delete_body(field(5, "All")) + field(2 + ALIAS, field(4, "Orphan"))
    with pytest.raises(ProtobufError, match="envelope: field number 4294967298"):
        delete_options(aliased_raw)


def _corpus() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text())
    return entries


@pytest.mark.parametrize("entry", _corpus(), ids=lambda entry: entry["id"])
def test_corpus_bodies_are_refused_or_read_as_the_apiserver_reads_them(
    entry: dict[str, Any],
) -> None:
    """Each body once read differently from the apiserver (which reads ``entry["apiserver"]``,
    checked on the real tier): now refused before anything goes upstream, or read alike."""
    data = bytes.fromhex(entry["hex"])
    read = delete_options if entry["target"] == "DeleteOptions" else read_envelope
    expect = entry["gatekeeper"]
    if "refused" in expect:
        with pytest.raises(ProtobufError, match=expect["refused"]) as refused:
            read(data)
        assert refused.value.problem is AMBIGUOUS  # Go reads it: nothing goes upstream
        return
    envelope = read_envelope(data)
    assert {key: getattr(envelope, _snake(key)) for key in expect["reads"]} == expect["reads"]
    assert read_envelope(with_resource_version(data, "77")).resource_version == "77"


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


def test_the_corpus_covers_the_tricks() -> None:
    ids = {entry["id"] for entry in _corpus()}
    assert len(ids) == len(_corpus())
    assert {"hidden-objectmeta-unpins-the-update", "objectmeta-tag-past-64-bits"} <= ids
