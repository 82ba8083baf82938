"""The request pipeline, composed in one place: identity → parse → decide → forward; audit always.

Each step is a function of its own module; none calls another. The one object carried through
is a :class:`~gatekeeper.flow.Flow`, and the audit event is built from it in ``finally``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from gatekeeper.audit import (
    STAGE_STARTED,
    AuditLevel,
    AuditSink,
    build_event,
    client_audit_id,
    logs_bodies,
)
from gatekeeper.audit.capture import ResponseCapture
from gatekeeper.body import decode_body, read_limited
from gatekeeper.errors import Refusal, UpstreamError
from gatekeeper.filtering import (
    DROPPED_ANNOTATION,
    PLAIN_JSON,
    WatchFilter,
    prime_watch,
    scoped_chunks,
)
from gatekeeper.flow import Flow
from gatekeeper.headers import forwarded_request_headers, response_headers, screen_request
from gatekeeper.identity import identify
from gatekeeper.policy import Engine
from gatekeeper.preview import preview_patch
from gatekeeper.requestinfo import RequestInfo, parse_request
from gatekeeper.status import status_body
from gatekeeper.upstream import Upstream

__all__ = ["GATEKEEPER", "Gatekeeper", "build_app", "handle"]

log = logging.getLogger("gatekeeper.proxy")

_BODY_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_MAX_CAPTURED_ERROR = 64 * 1024


@dataclass(slots=True)
class Gatekeeper:
    """What the pipeline needs, built once by the server and shared by every request."""

    engine: Engine
    upstream: Upstream
    audit: AuditSink
    audit_level: AuditLevel = AuditLevel.METADATA
    socket_drivers: dict[str, str] = field(default_factory=dict)

    @property
    def node_name(self) -> str:
        return self.engine.node_name


GATEKEEPER = web.AppKey("gatekeeper", Gatekeeper)


def build_app(gatekeeper: Gatekeeper) -> web.Application:
    app = web.Application(client_max_size=0)
    app[GATEKEEPER] = gatekeeper
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def handle(request: web.Request) -> web.StreamResponse:
    """The whole pipeline for one request."""
    gk = request.app[GATEKEEPER]
    flow = Flow(
        method=request.method,
        raw_target=request.raw_path,
        source_ips=(request.remote,) if request.remote else (),
        user_agent=request.headers.get("User-Agent", ""),
        node_name=gk.node_name,
        client_audit_id=client_audit_id(request.headers),
    )
    try:
        flow.identity = identify(request.transport, gk.socket_drivers)
        screen_request(request.method, request.headers)
        flow.info = parse_request(request.method, request.raw_path)
        flow.media_type, flow.body = await read_body(request, flow.info)
        if (path := gk.engine.lookup(flow.identity, flow.info)) is not None:
            flow.current = await gk.upstream.fetch(path)
        if gk.engine.needs_preview(flow.identity, flow.info, flow.current, flow.media_type):
            flow.proposed = await preview_patch(
                gk.upstream, flow.info, flow.media_type, flow.body, flow.current
            )
        flow.decision = gk.engine.decide(
            flow.identity,
            flow.info,
            flow.body,
            flow.current,
            media_type=flow.media_type,
            proposed=flow.proposed,
        )
        if not flow.decision.allowed:
            decision = flow.decision
            raise Refusal(
                decision.code, decision.reason, decision.message, details=decision.details
            )
        return await forward(request, flow, gk.upstream)
    except Refusal as refusal:
        flow.refusal = refusal
        return _status_response(
            flow, refusal.code, refusal.message, refusal.details, retry_after=refusal.retry_after
        )
    except UpstreamError as error:
        log.warning(
            "upstream error audit_id=%s code=%s %s", flow.audit_id, error.code, error.message
        )
        return _status_response(
            flow, error.code, error.message, {}, retry_after=1 if error.code == 503 else None
        )
    finally:
        if flow.completed is None:
            flow.finish(flow.status_code or 499, "client disconnected")
        await gk.audit.emit(build_event(flow, gk.audit_level))


async def read_body(request: web.Request, info: RequestInfo) -> tuple[str, Any]:
    """The media type and decoded body of a writing verb (None when absent); 415/413/400."""
    media_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if not info.is_resource_request or info.verb not in _BODY_VERBS:
        return media_type, None
    raw = await read_limited(request.content.iter_chunked(64 * 1024))
    if not raw:
        return media_type, None
    media_type, decoded = decode_body(raw, media_type, patch=info.verb == "patch")
    if not isinstance(decoded, dict) and not (info.verb == "patch" and isinstance(decoded, list)):
        raise Refusal(400, "request body must be a JSON object (or a JSON patch list)")
    return media_type, decoded


async def forward(request: web.Request, flow: Flow, upstream: Upstream) -> web.StreamResponse:
    """Send the decided request upstream and stream the answer back as it arrives."""
    decision = flow.decision
    assert decision is not None and decision.target is not None
    target = decision.target
    payload = None if decision.body is None else json.dumps(decision.body).encode()
    headers = forwarded_request_headers(
        request.headers,
        audit_id=flow.audit_id,
        token=upstream.token(),
        content_type=None if payload is None else decision.media_type,
    )
    watch_state: WatchFilter | None = None
    if decision.filter is not None:
        # SECURITY: DESIGN §4.3 — a kind scoped object by object is filtered on full objects:
        # a Table or metadata-only answer cannot be, so it is never asked for.
        headers["Accept"] = PLAIN_JSON
        if flow.long_running:
            watch_state = await prime_watch(upstream, target, decision.filter)
        else:
            watch_state = WatchFilter(decision.filter)
    response: web.StreamResponse | None = None
    try:
        async with upstream.request(
            target.method, target.target, headers, payload, long_running=flow.long_running
        ) as upstream_response:
            flow.upstream_audit_id = upstream_response.headers.get("Audit-Id", "")
            flow.status_code = upstream_response.status
            response = web.StreamResponse(
                status=upstream_response.status,
                headers=response_headers(upstream_response.headers, audit_id=flow.audit_id),
            )
            gk = request.app[GATEKEEPER]
            capture = ResponseCapture(
                gk.audit_level is AuditLevel.REQUEST_RESPONSE
                and logs_bodies(flow.info)
                and not flow.long_running,
                upstream_response.headers.get("Content-Type", ""),
            )
            if upstream_response.status >= 400:
                payload = await upstream_response.content.read(_MAX_CAPTURED_ERROR)
                flow.status_message = _message_of(payload)
                await response.prepare(request)
                capture.feed(payload)
                await response.write(payload)
                async for chunk in upstream_response.content.iter_any():
                    capture.feed(chunk)
                    await response.write(chunk)
            else:
                chunks: AsyncIterator[bytes] = upstream_response.content.iter_any()
                if decision.filter is not None:
                    chunks = await scoped_chunks(
                        target, upstream_response.content, decision.filter, watch_state
                    )
                await response.prepare(request)
                flow.response_started = datetime.now(UTC)
                if flow.long_running:
                    event = build_event(flow, gk.audit_level, STAGE_STARTED)
                    await gk.audit.emit(event)
                async for chunk in chunks:
                    capture.feed(chunk)
                    await response.write(chunk)
            await response.write_eof()
    except UpstreamError as error:
        if response is None or not response.prepared:
            raise
        # The status line is already sent, so no Status can follow: break the driver's
        # connection, as a dying apiserver would, so its client re-lists or re-watches
        # instead of waiting on a stream that will never end.
        log.warning("upstream failed mid-response audit_id=%s %s", flow.audit_id, error.message)
        flow.finish(flow.status_code, error.message)
        if request.transport is not None:
            request.transport.close()
        return response
    finally:
        if watch_state is not None and watch_state.dropped:
            flow.annotations[DROPPED_ANNOTATION] = watch_state.annotation()
    flow.response_object = capture.result()
    flow.finish(upstream_response.status)
    return response


def _status_response(
    flow: Flow,
    code: int,
    message: str,
    details: dict[str, str],
    *,
    retry_after: int | None,
) -> web.Response:
    extra: dict[str, object] = dict(details)
    headers = {"Audit-Id": flow.audit_id}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
        extra["retryAfterSeconds"] = retry_after
    body = status_body(code, message, details=extra or None)
    flow.response_object = body
    flow.finish(code, message)
    return web.json_response(body, status=code, headers=headers)


def _message_of(payload: bytes) -> str:
    try:
        return str(json.loads(payload).get("message", ""))
    except (ValueError, AttributeError):
        return ""
