"""The request body of a writing verb, read from the driver within the body limits and decoded
for the engine (DESIGN §4.4): JSON and apply YAML read here, protobuf and CBOR carried as bytes
for the apiserver to decode."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gatekeeper.errors import Refusal
from gatekeeper.request.body import JSON, MAX_BODY_BYTES, decode_body, read_limited, too_large
from gatekeeper.request.encoded import ENCODED_MEDIA_TYPES, read_encoded
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.rule import Rule

__all__ = ["read_body"]

_BODY_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


async def read_body(
    request: web.BaseRequest, info: RequestInfo, timeout: float | None = None
) -> tuple[str, Any]:
    """The media type and decoded body of a writing verb (None when absent); 415/413/408/400."""
    media_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if not info.is_resource_request or info.verb not in _BODY_VERBS:
        return media_type, None
    content = request.content
    if content.is_eof():
        # The whole body has arrived (aiohttp buffers at most its high-water mark, far below
        # the limit, before it is read): taken as it is, with no wait to time.
        raw = content.read_nowait()
        if len(raw) > MAX_BODY_BYTES:
            raise too_large()
    else:
        chunks = content.iter_chunked(64 * 1024)
        raw = await (
            read_limited(chunks) if timeout is None else read_limited(chunks, timeout=timeout)
        )
    if not raw:
        return media_type, None
    if media_type in ENCODED_MEDIA_TYPES:
        encoded = read_encoded(raw, media_type, info.verb)
        # A protobuf DeleteOptions body is read here and goes on as the JSON it stands for.
        return (JSON, encoded) if isinstance(encoded, dict) else (media_type, encoded)
    media_type, decoded = decode_body(raw, media_type, patch=info.verb == "patch")
    if not isinstance(decoded, dict) and not (info.verb == "patch" and isinstance(decoded, list)):
        raise Refusal(
            400, "request body must be a JSON object (or a JSON patch list)", rule=Rule.BAD_BODY
        )
    return media_type, decoded
