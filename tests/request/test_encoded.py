"""Protobuf and CBOR request bodies as the request stage reads them: a body the apiserver could
read differently from the gatekeeper is refused with 400 before anything goes upstream; bytes
the apiserver refuses too are left to its own dry-run error."""

from __future__ import annotations

import pytest

from gatekeeper.codec.kubeproto import MAGIC
from gatekeeper.errors import Refusal
from gatekeeper.request.encoded import PROTOBUF, EncodedBody, read_encoded
from tests.codec.test_kubeproto import ALIAS, META, SPEC, body, delete_body, field

HIDDEN_META = field(1 + ALIAS, field(6, ""))
"""A second ObjectMeta under an aliased tag: resourceVersion "" to the apiserver."""


@pytest.mark.parametrize("verb", ["create", "update"])
@pytest.mark.parametrize(
    ("data", "message"),
    [
        (body(META, rest=SPEC + HIDDEN_META), "object: field number 4294967297 is above"),
        (body(META + field(6, "")), "metadata field 6 occurs more than once"),
        (body(META.replace(field(1, "s1"), field(1, b"s\xff"))), "metadata.name is not UTF-8"),
    ],
)
def test_a_body_the_apiserver_could_read_otherwise_is_refused(
    verb: str, data: bytes, message: str
) -> None:
    with pytest.raises(Refusal) as refused:
        read_encoded(data, PROTOBUF, verb)
    assert refused.value.code == 400
    assert refused.value.reason.startswith("protobuf request body: ")
    assert message in refused.value.reason


@pytest.mark.parametrize(
    "data",
    [MAGIC + b"\n\xff\xff\xffgarbage", b"\n\x03foo", MAGIC + b"\x0c"],
    ids=["truncated", "no-magic", "end-group"],
)
def test_bytes_the_apiserver_refuses_too_are_left_to_its_dry_run(data: bytes) -> None:
    read = read_encoded(data, PROTOBUF, "update")
    assert isinstance(read, EncodedBody) and read.envelope is None and read.unreadable


def test_an_aliased_delete_options_body_is_refused() -> None:
    data = delete_body(field(5, "All")) + field(2 + ALIAS, field(4, "Orphan"))
    with pytest.raises(Refusal) as refused:
        read_encoded(data, PROTOBUF, "delete")
    assert refused.value.code == 400
    assert "envelope: field number 4294967298" in refused.value.reason
