"""Request bodies: depth, non-finite numbers and YAML that is not JSON written in YAML are
refused (400) before anything is built from them."""

from __future__ import annotations

import asyncio
import resource
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gatekeeper.errors import Refusal
from gatekeeper.request.body import MAX_BODY_DEPTH, decode_body, read_limited

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
# 563 bytes that expand to 9**9 strings: the alias bomb.
BOMB = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
)

REFUSED = [
    (
        "json-too-deep",
        MERGE,
        '{"a":' * (MAX_BODY_DEPTH + 1) + "1" + "}" * (MAX_BODY_DEPTH + 1),
        "nested more than 100 levels",
    ),
    ("json-5000-deep", MERGE, "[" * 5000 + "]" * 5000, "nested more than 100 levels"),
    ("json-1e400", MERGE, '{"a":1e400}', "not a finite double"),
    ("json-nan", MERGE, '{"a":NaN}', "NaN is not JSON"),
    ("json-infinity", MERGE, '{"a":-Infinity}', "Infinity is not JSON"),
    ("yaml-alias-bomb", APPLY, BOMB, "anchor or alias"),
    ("yaml-alias", APPLY, "a: &x 1\nb: *x\n", "anchor or alias"),
    ("yaml-merge-key-alias", APPLY, "a: &x {k: 1}\nb:\n  <<: *x\n", "anchor or alias"),
    ("yaml-set", APPLY, "a: !!set {x, y}\n", "tag:yaml.org,2002:set"),
    ("yaml-binary", APPLY, "a: !!binary aGVsbG8=\n", "tag:yaml.org,2002:binary"),
    ("yaml-timestamp-tag", APPLY, "a: !!timestamp 2024-01-01\n", "tag:yaml.org,2002:timestamp"),
    ("yaml-python-tag", APPLY, "a: !!python/object:os.system {}\n", "python/object"),
    ("yaml-local-tag", APPLY, "a: !foo 1\n", "YAML tag !foo"),
    ("yaml-inf", APPLY, "a: .inf\n", "not a finite double"),
    ("yaml-1.0e+400", APPLY, "a: 1.0e+400\n", "not a finite double"),
    ("yaml-too-deep", APPLY, "a: " + "[" * 150 + "]" * 150, "nested more than 100 levels"),
    ("yaml-two-documents", APPLY, "a: 1\n---\nb: 2\n", "more than one YAML document"),
    ("yaml-int-key", APPLY, "1: x\n", "key that is not a string"),
    ("yaml-case-keys", APPLY, "a: 1\nA: 2\n", "differing only in case"),
    ("yaml-huge-int", APPLY, "a: " + "9" * 5000 + "\n", "not valid YAML"),
]


@pytest.mark.parametrize(
    ("media", "text", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_refused_with_400(media: str, text: str, message: str) -> None:
    with pytest.raises(Refusal) as caught:
        decode_body(text.encode(), media, patch=True)
    assert caught.value.code == 400
    assert message in caught.value.message


ACCEPTED: list[tuple[str, str, str, Any]] = [
    (
        "json-at-the-limit",
        MERGE,
        '{"a":' * (MAX_BODY_DEPTH - 1) + "{}" + "}" * (MAX_BODY_DEPTH - 1),
        None,
    ),
    ("json-large-finite", MERGE, '{"a":1e308}', {"a": 1e308}),
    ("yaml-date-stays-a-string", APPLY, "a: 2024-01-01\n", {"a": "2024-01-01"}),
    ("yaml-merge-key-is-a-string", APPLY, "<<: x\n", {"<<": "x"}),
    (
        "yaml-json-types",
        APPLY,
        "a: ~\nb: true\nc: 1\nd: 1.5\ne: '1'\nf: !!str 2\n",
        {"a": None, "b": True, "c": 1, "d": 1.5, "e": "1", "f": "2"},
    ),
]


@pytest.mark.parametrize(
    ("media", "text", "expected"), [r[1:] for r in ACCEPTED], ids=[r[0] for r in ACCEPTED]
)
def test_accepted(media: str, text: str, expected: Any) -> None:
    _, value = decode_body(text.encode(), media, patch=True)
    if expected is not None:
        assert value == expected


def test_alias_bomb_is_refused_before_it_expands() -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(Refusal):
        decode_body(BOMB.encode(), APPLY, patch=True)
    # Expanded, it is 387 million strings; refused from the events, it costs nothing measurable.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB
    assert len(BOMB) < 600


async def test_a_body_that_trickles_past_the_timeout_is_408() -> None:
    async def slow() -> AsyncIterator[bytes]:
        yield b"{"
        await asyncio.sleep(30)
        yield b"}"

    with pytest.raises(Refusal) as caught:
        await read_limited(slow(), timeout=0.2)
    assert caught.value.code == 408 and "did not arrive within 0.2 seconds" in caught.value.message


async def test_a_body_past_the_limit_is_413() -> None:
    async def big() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 100

    with pytest.raises(Refusal) as caught:
        await read_limited(big(), limit=500)
    assert caught.value.code == 413
