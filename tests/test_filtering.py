"""The response filter of scoped kinds: watch state, line splitting, bounded reads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gatekeeper import filtering
from gatekeeper.errors import UpstreamError
from gatekeeper.filtering import WatchFilter, scoped_chunks
from gatekeeper.policy import Decision
from gatekeeper.requestinfo import parse_request

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"


def obj(name: str, mine: bool, rv: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"u-{name}",
            "resourceVersion": rv,
        },
        "status": {"mine": mine},
    }


def keep(o: dict[str, Any]) -> bool:
    return bool(o.get("status", {}).get("mine"))


def ev(kind: str, o: Any) -> dict[str, Any]:
    return {"type": kind, "object": o}


STUB = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "a", "namespace": "default", "uid": "u-a", "resourceVersion": "3"},
}
SEQUENCES = [
    ("added-in-scope", [ev("ADDED", obj("a", True))], ["ADDED"]),
    ("added-out-of-scope", [ev("ADDED", obj("a", False))], []),
    ("enters-as-added", [ev("ADDED", obj("a", False)), ev("MODIFIED", obj("a", True))], ["ADDED"]),
    (
        "leaves-as-deleted-once",
        [
            ev("ADDED", obj("a", True)),
            ev("MODIFIED", obj("a", False, "3")),
            ev("MODIFIED", obj("a", False, "4")),
        ],
        ["ADDED", "DELETED"],
    ),
    (
        "deleted-in-scope",
        [ev("ADDED", obj("a", True)), ev("DELETED", obj("a", True))],
        ["ADDED", "DELETED"],
    ),
    ("deleted-never-shown", [ev("DELETED", obj("a", False))], []),
    ("bookmark-passes", [ev("BOOKMARK", {"metadata": {"resourceVersion": "9"}})], ["BOOKMARK"]),
    ("error-passes", [ev("ERROR", {"kind": "Status", "code": 410})], ["ERROR"]),
    ("unknown-type-dropped", [ev("WEIRD", obj("a", True))], []),
    ("not-an-object-dropped", [ev("ADDED", ["x"]), "junk"], []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("events", "types"), [c[1:] for c in SEQUENCES], ids=[c[0] for c in SEQUENCES]
)
def test_watch_state(events: list[Any], types: list[str]) -> None:
    state = WatchFilter(keep)
    out = [e for e in (state.event(event) for event in events) if e is not None]
    assert [e["type"] for e in out] == types


def test_a_deleted_stub_shows_only_identity() -> None:
    state = WatchFilter(keep)
    state.event(ev("ADDED", obj("a", True)))
    assert state.event(ev("MODIFIED", obj("a", False, "3"))) == ev("DELETED", STUB)


def test_a_primed_state_knows_what_the_list_showed() -> None:
    state = WatchFilter(keep, {("default", "a")})
    assert state.event(ev("MODIFIED", obj("a", True)))["type"] == "MODIFIED"
    assert state.event(ev("MODIFIED", obj("a", False, "3"))) == ev("DELETED", STUB)


async def content(*chunks: bytes) -> AsyncIterator[bytes]:
    """An upstream body that arrives in the given chunks."""
    for chunk in chunks:
        yield chunk


async def collect(chunks: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in chunks])


async def run(target: str, *chunks: bytes) -> bytes:
    """The filtered body for an upstream body arriving in ``chunks``."""
    info = parse_request("GET", target)
    return await collect(await scoped_chunks(info, content(*chunks), keep, None))


async def test_watch_lines_split_across_chunks() -> None:
    lines = [json.dumps(ev("ADDED", obj(n, n != "b"))).encode() for n in "abc"]
    stream = b"\n".join(lines) + b"\n"
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    info = parse_request("GET", f"{CLAIMS}?watch=true")
    out = await collect(await scoped_chunks(info, content(*pieces), keep, None))
    names = [json.loads(line)["object"]["metadata"]["name"] for line in out.splitlines()]
    assert names == ["a", "c"]
    assert out.splitlines()[0] == lines[0]  # passed through byte for byte


async def test_an_overlong_watch_line_ends_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filtering, "MAX_WATCH_LINE", 100)
    info = parse_request("GET", f"{CLAIMS}?watch=true")
    first = json.dumps(ev("ADDED", obj("a", True))).encode() + b"\n"
    body = content(first, b"{" + b" " * 80, b" " * 80)
    out = (await collect(await scoped_chunks(info, body, keep, None))).splitlines()
    assert json.loads(out[0])["type"] == "ADDED"
    error = json.loads(out[1])
    assert error["type"] == "ERROR" and "exceeds 100 bytes" in error["object"]["message"]


async def test_a_list_is_filtered_and_a_table_refused() -> None:
    info = parse_request("GET", CLAIMS)
    listing = {
        "kind": "ResourceClaimList",
        "metadata": {"remainingItemCount": 5},
        "items": [obj("a", True), obj("b", False)],
    }
    out = json.loads(await run(CLAIMS, json.dumps(listing).encode()))
    assert [i["metadata"]["name"] for i in out["items"]] == ["a"]
    assert out["metadata"] == {}
    table = {"kind": "Table", "rows": [{"object": obj("b", False)}]}
    with pytest.raises(UpstreamError, match="not a list"):
        await scoped_chunks(info, content(json.dumps(table).encode()), keep, None)


async def test_a_get_out_of_scope_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    info = parse_request("GET", f"{CLAIMS}/b")
    refused = await scoped_chunks(info, content(json.dumps(obj("b", False)).encode()), keep, None)
    assert isinstance(refused, Decision)
    assert refused.code == 404
    assert refused.message == 'resourceclaims.resource.k8s.io "b" not found'
    monkeypatch.setattr(filtering, "MAX_FILTERED_BODY", 10)
    with pytest.raises(UpstreamError, match="exceeds 10 bytes"):
        await scoped_chunks(info, content(json.dumps(obj("b", True)).encode()), keep, None)
