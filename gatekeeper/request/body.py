"""Request bodies: JSON only, bounded in size and depth, finite numbers, no duplicate or
case-colliding keys (DESIGN §4.4); apply-patch YAML read by :mod:`gatekeeper.codec.yamlbody`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import yaml

from gatekeeper.codec.jsonbounds import MAX_BODY_DEPTH, finite_float, shallow, within_depth
from gatekeeper.codec.yamlbody import YAMLBodyError, load_json_yaml
from gatekeeper.errors import Refusal
from gatekeeper.rule import Rule

__all__ = [
    "APPLY_YAML",
    "BODY_TIMEOUT",
    "JSON",
    "MAX_BODY_BYTES",
    "MAX_BODY_DEPTH",
    "decode_body",
    "decode_json",
    "read_limited",
    "too_large",
]

JSON = "application/json"
APPLY_YAML = "application/apply-patch+yaml"
_JSON_TYPES = frozenset(
    {
        JSON,
        "application/merge-patch+json",
        "application/json-patch+json",
        "application/strategic-merge-patch+json",
    }
)

MAX_BODY_BYTES = 3 * 1024 * 1024
BODY_TIMEOUT = 30.0
"""Seconds to receive a whole request body (``Limits.body_timeout``)."""


async def read_limited(
    chunks: AsyncIterator[bytes],
    limit: int = MAX_BODY_BYTES,
    timeout: float | None = BODY_TIMEOUT,
) -> bytes:
    """Read a body chunk by chunk; 413 as soon as it passes ``limit`` (never buffered past it),
    408 when it has not all arrived within ``timeout`` seconds (a slow sender holds nothing)."""
    buffer = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in chunks:
                buffer += chunk
                if len(buffer) > limit:
                    raise too_large(limit)
    except TimeoutError:
        raise Refusal(
            408,
            "request body not received in time",
            f"the request body did not arrive within {timeout:g} seconds",
        ) from None
    return bytes(buffer)


def too_large(limit: int = MAX_BODY_BYTES) -> Refusal:
    """The 413 of a body larger than ``limit`` bytes."""
    return Refusal(
        413,
        f"request body is larger than {limit} bytes",
        f"Request entity too large: limit is {limit}",
    )


def decode_body(raw: bytes, media_type: str, *, patch: bool) -> tuple[str, Any]:
    """The effective media type and the decoded body; 415 for anything but JSON (and apply YAML).

    Patches take the four patch types; other writes take ``application/json`` only.
    """
    if not media_type and not patch:
        # The apiserver reads a body without Content-Type as its first media type, JSON (and
        # the official Python client sends none); the gatekeeper forwards it as JSON explicitly.
        media_type = JSON
    accepted = _JSON_TYPES | {APPLY_YAML} if patch else {JSON}
    if media_type not in accepted or (patch and media_type == JSON):
        wanted = ", ".join(sorted(accepted - {JSON})) if patch else JSON
        raise Refusal(
            415,
            f'content type "{media_type}" is not accepted',
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{wanted} (configure the driver's client to send JSON, not protobuf or YAML)",
        )
    if media_type == APPLY_YAML:
        return media_type, _decode_yaml(raw)
    return media_type, decode_json(raw)


def _decode_yaml(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(400, "request body is not UTF-8", rule=Rule.BAD_BODY) from exc
    try:
        return load_json_yaml(text, _unique_object)
    except (_AmbiguousKey, YAMLBodyError) as exc:
        raise Refusal(400, str(exc), rule=Rule.BAD_BODY) from exc
    except (yaml.YAMLError, ValueError) as exc:
        # ValueError: a scalar the resolver typed but cannot convert (an int of 5,000 digits).
        raise Refusal(
            400, f"request body is not valid YAML: {' '.join(str(exc).split())}", rule=Rule.BAD_BODY
        ) from exc


def decode_json(raw: bytes) -> Any:
    """Parse a JSON body, refusing (400) what two parsers could read differently, numbers that
    are not finite doubles, and nesting deeper than :data:`MAX_BODY_DEPTH`."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(400, "request body is not UTF-8", rule=Rule.BAD_BODY) from exc
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_object,
            parse_constant=_no_constant,
            parse_float=finite_float,
        )
    except RecursionError:
        # The C decoder recurses per level: past ~1,000 levels, the body is far too deep anyway.
        raise _too_deep() from None
    except _AmbiguousKey as exc:
        raise Refusal(400, str(exc), rule=Rule.BAD_BODY) from exc
    except ValueError as exc:
        raise Refusal(400, f"request body is not valid JSON: {exc}", rule=Rule.BAD_BODY) from exc
    if not shallow(raw, MAX_BODY_DEPTH) and not within_depth(value, MAX_BODY_DEPTH):
        raise _too_deep()
    return value


def _too_deep() -> Refusal:
    # SECURITY: docs/design-decisions.md#bounded-parsing — the apiserver accepts 10,000
    # levels; the gatekeeper decides on, copies and compares bodies, and a driver has no use
    # for more than this.
    return Refusal(
        400,
        f"request body is nested more than {MAX_BODY_DEPTH} levels deep",
        f"request body is nested more than {MAX_BODY_DEPTH} levels deep: the gatekeeper accepts "
        f"at most {MAX_BODY_DEPTH}",
        rule=Rule.BAD_BODY,
    )


class _AmbiguousKey(ValueError):
    pass


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # SECURITY: DESIGN §4.4 — Go's decoder matches keys case-insensitively and keeps the last
    # duplicate, so `{"driver": "a", "Driver": "b"}` could be checked as "a" and stored as "b".
    obj = dict(pairs)
    size = len(obj)
    if size == len(pairs) and (size < 2 or len(set(map(str.lower, obj))) == size):
        return obj  # the common case, checked in C; the loop below names the offending keys
    seen: dict[str, str] = {}
    for key, _ in pairs:
        folded = key.lower()
        if folded in seen:
            what = "duplicate key" if seen[folded] == key else "keys differing only in case"
            raise _AmbiguousKey(f'request body has {what}: "{seen[folded]}" and "{key}"')
        seen[folded] = key
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
