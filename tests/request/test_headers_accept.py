"""Which ``Accept`` headers a plain JSON object answers (a get is then answered from the object
the gatekeeper read and checked: a second read could return another object). A client that
prefers protobuf and takes JSON too (client-go's typed clients) is answered in JSON."""

from __future__ import annotations

import pytest

from gatekeeper.request.headers import accepts_plain_json

CASES = [
    ("absent", "", True),
    ("json", "application/json", True),
    ("client-go-json", "application/json, */*", True),
    ("any", "*/*", True),
    ("charset-and-q", "application/json;charset=utf-8;q=0.9, */*;q=0.1", True),
    ("upper-case", "Application/JSON", True),
    ("kubectl-table", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json", False),
    ("partial-metadata", "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io", False),
    ("client-go-typed", "application/vnd.kubernetes.protobuf,application/json", True),
    ("cbor-first", "application/cbor, application/json", True),
    ("protobuf-only", "application/vnd.kubernetes.protobuf", False),
    (
        "protobuf-table",
        "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json",
        False,
    ),
    ("yaml", "application/yaml", False),
    ("stream-watch", "application/json;stream=watch", False),
]


@pytest.mark.parametrize(("accept", "plain"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_accepts_plain_json(accept: str, plain: bool) -> None:
    assert accepts_plain_json(accept) is plain
