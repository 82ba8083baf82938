"""The step before forwarding: the engine's conversation driven with the driver's request and
the upstream as its readers."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gatekeeper.audit.flow import Flow
from gatekeeper.errors import Refusal
from gatekeeper.policy.conversation import Answer, Body, Fetch, conversation
from gatekeeper.policy.decision import Decision
from gatekeeper.proxy.state import Gatekeeper
from gatekeeper.request.body import JSON, MAX_BODY_BYTES, decode_body, read_limited, too_large
from gatekeeper.request.encoded import ENCODED_MEDIA_TYPES, read_encoded
from gatekeeper.request.headers import accepts_plain_json
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.rule import Rule
from gatekeeper.upstream.previews import run_preview
from gatekeeper.upstream.session import fetch

__all__ = ["decide", "read_body"]

_BODY_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


async def decide(request: web.BaseRequest, flow: Flow, gk: Gatekeeper) -> Decision:
    """The engine's conversation (:mod:`gatekeeper.policy.conversation`), its readers the
    driver's request body and the upstream; what they read is kept on ``flow`` for the audit."""
    assert flow.identity is not None and flow.info is not None
    plain_json = accepts_plain_json(request.headers.get("Accept", ""))
    talk = conversation(gk.engine, flow.identity, flow.info, plain_json=plain_json)
    answer: Answer = None
    try:
        while True:
            step = talk.send(answer)
            if isinstance(step, Body):
                timeout = gk.budgets.limits.body_timeout
                flow.media_type, flow.body = await read_body(request, flow.info, timeout)
                answer = (flow.media_type, flow.body)
            elif isinstance(step, Fetch):
                flow.current = answer = await fetch(gk.upstream, step.path)
            else:
                flow.proposed = answer = await run_preview(gk.upstream, step)
    except StopIteration as done:
        decision: Decision = done.value
        return decision


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
