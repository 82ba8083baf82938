"""Request bodies: JSON only, bounded, with no duplicate or case-colliding keys (DESIGN §4.4)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import yaml

from gatekeeper.errors import Refusal

__all__ = ["APPLY_YAML", "JSON", "MAX_BODY_BYTES", "decode_body", "decode_json", "read_limited"]

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


async def read_limited(chunks: AsyncIterator[bytes], limit: int = MAX_BODY_BYTES) -> bytes:
    """Read a body chunk by chunk; 413 as soon as it passes ``limit`` (never buffered past it)."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        if len(buffer) > limit:
            raise Refusal(
                413,
                f"request body is larger than {limit} bytes",
                f"Request entity too large: limit is {limit}",
            )
    return bytes(buffer)


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
        raise Refusal(400, "request body is not UTF-8") from exc
    try:
        decoded = yaml.load(text, Loader=_UniqueKeyLoader)
    except _AmbiguousKey as exc:
        raise Refusal(400, str(exc)) from exc
    except yaml.YAMLError as exc:
        raise Refusal(400, f"request body is not valid YAML: {' '.join(str(exc).split())}") from exc
    return decoded


def decode_json(raw: bytes) -> Any:
    """Parse a JSON body, refusing (400) what two parsers could read differently."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refusal(400, "request body is not UTF-8") from exc
    try:
        return json.loads(text, object_pairs_hook=_unique_object, parse_constant=_no_constant)
    except _AmbiguousKey as exc:
        raise Refusal(400, str(exc)) from exc
    except ValueError as exc:
        raise Refusal(400, f"request body is not valid JSON: {exc}") from exc


class _AmbiguousKey(ValueError):
    pass


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # SECURITY: DESIGN §4.4 — Go's decoder matches keys case-insensitively and keeps the last
    # duplicate, so `{"driver": "a", "Driver": "b"}` could be checked as "a" and stored as "b".
    seen: dict[str, str] = {}
    for key, _ in pairs:
        folded = key.lower()
        if folded in seen:
            what = "duplicate key" if seen[folded] == key else "keys differing only in case"
            raise _AmbiguousKey(f'request body has {what}: "{seen[folded]}" and "{key}"')
        seen[folded] = key
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _UniqueKeyLoader(yaml.SafeLoader):
    """Safe YAML whose mappings follow the same no-duplicate, no-case-collision rule."""


def _yaml_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[str, Any]:
    loader.flatten_mapping(node)
    pairs = [
        (loader.construct_object(k, deep=True), loader.construct_object(v, deep=True))
        for k, v in node.value
    ]
    if not all(isinstance(key, str) for key, _ in pairs):
        raise _AmbiguousKey("request body has a mapping key that is not a string")
    return _unique_object(pairs)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _yaml_mapping)
