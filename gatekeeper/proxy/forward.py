"""Forwarding: the decided request sent upstream, its answer streamed back as it arrives
(filtered object by object where the decision says so)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from gatekeeper.audit import STAGE_STARTED, AuditLevel, build_event, logs_bodies
from gatekeeper.audit.capture import ResponseCapture
from gatekeeper.audit.event import ERROR_ANNOTATION
from gatekeeper.audit.flow import Flow, Forwarded
from gatekeeper.codec import jsoncodec
from gatekeeper.errors import Refusal, UpstreamError
from gatekeeper.policy.decision import Decision
from gatekeeper.policy.model import Credentials
from gatekeeper.proxy.answer import answer
from gatekeeper.proxy.filtering import PLAIN_JSON, scoped_chunks, scoped_error
from gatekeeper.proxy.listing import FilteredReads
from gatekeeper.proxy.paging import prime_listing, upstream_target
from gatekeeper.proxy.scoped import DROPPED_ANNOTATION, WatchFilter, dropped_annotation
from gatekeeper.proxy.state import Gatekeeper
from gatekeeper.request.headers import bearer_token, forwarded_request_headers, response_headers
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import KubeObject
from gatekeeper.upstream.session import Pool, UpstreamResponse

__all__ = ["forward"]

log = logging.getLogger("gatekeeper.proxy")

_MAX_CAPTURED_ERROR = 64 * 1024


async def forward(request: web.BaseRequest, flow: Flow, gk: Gatekeeper) -> web.StreamResponse:
    """Send the decided request upstream and stream the answer back as it arrives."""
    decision = flow.decision
    assert decision is not None and decision.target is not None and flow.identity is not None
    payload = _payload(decision.body)
    media_type = None if payload is None else decision.media_type
    headers = forwarded_request_headers(
        request.headers, audit_id=flow.audit_id, content_type=media_type
    )
    pool: Pool = "watches" if flow.long_running else "requests"
    target = decision.target
    if decision.filter is None:
        # DESIGN §4.3a — a kind forwarded under the driver's own credentials carries the token
        # the driver sent (reviewed when it was identified), never the gatekeeper's.
        credential = None
        if decision.credentials is Credentials.DRIVER:
            credential = bearer_token(request.headers)
            if credential is None:
                # Fail closed: never the gatekeeper's credentials in the driver's stead.
                raise Refusal(401, "no bearer token to forward", "Unauthorized: no bearer token")
        sent = gk.upstream.stream(
            target.method, target.target, headers, payload, pool=pool, credential=credential
        )
        return await _exchange(request, flow, gk, target, sent, media_type, None)
    # SECURITY: DESIGN §4.3 — a kind scoped object by object is filtered on full objects:
    # a Table or metadata-only answer cannot be, so it is never asked for.
    headers["Accept"] = PLAIN_JSON
    target = upstream_target(target)
    driver = flow.identity.driver
    reads = FilteredReads(
        gk.filtered_reads, gk.budgets, gk.upstream, driver, decision.filter, headers
    )
    if target.verb == "list":
        # SECURITY: docs/operating.md "Filtered reads" — read whole and shared: identical
        # lists in flight cost one upstream read, whatever their number.
        listed = await reads.listed(target)
        if listed.dropped:
            flow.annotations[DROPPED_ANNOTATION] = dropped_annotation(listed.dropped)
        return await _exchange(request, flow, gk, target, listed.answer(target.method), None, None)
    state = WatchFilter(decision.filter)  # counts what a get drops
    if flow.long_running and (listing := prime_listing(target)) is not None:
        # SECURITY: docs/operating.md "Filtered reads" — a watch's prime is a list read like
        # any other (shared, one of the driver's turns), and one of its requests in flight.
        with gk.budgets.admit(driver, watch=False):
            state = await reads.primed(listing)
    sent = gk.upstream.stream(target.method, target.target, headers, payload, pool=pool)
    return await _exchange(request, flow, gk, target, sent, media_type, state)


async def _exchange(
    request: web.BaseRequest,
    flow: Flow,
    gk: Gatekeeper,
    target: RequestInfo,
    sent: AbstractAsyncContextManager[UpstreamResponse],
    media_type: str | None,
    state: WatchFilter | None,
) -> web.StreamResponse:
    """The upstream round trip of :func:`forward`: the answer ``sent`` opens, filtered with
    ``state`` (a get or watch of a scoped kind) or already filtered (a list)."""
    assert flow.decision is not None
    flow.forwarded = Forwarded(target.method, target.target, media_type)
    response: web.StreamResponse | None = None
    scrub = flow.decision.filter is not None
    try:
        async with sent as answered:
            flow.upstream_audit_id = answered.headers.get("Audit-Id", "")
            flow.status_code = answered.status
            body = answered.chunks()
            if answered.status < 400 and state is not None:
                scoped = await scoped_chunks(target, body, state)
                if isinstance(scoped, Decision):
                    # The object left the driver's scope after the engine's read: one 404.
                    flow.decision = scoped
                    return answer(flow, scoped)
                body = scoped
            response = web.StreamResponse(
                status=answered.status,
                headers=response_headers(answered.headers, audit_id=flow.audit_id),
            )
            if (length := _passed_length(request.method, answered, state, scrub)) is not None:
                response.content_length = length
            flow.response_object = await _relay(request, response, flow, gk, answered, body, scrub)
    except Exception as exc:
        reset = isinstance(exc, ConnectionResetError)
        if response is None or not (response.prepared or reset):
            raise
        return _broken(request, response, flow, exc)
    finally:
        if state is not None and state.dropped:
            flow.annotations[DROPPED_ANNOTATION] = state.annotation()
    flow.finish(answered.status)
    return response


def _broken(
    request: web.BaseRequest, response: web.StreamResponse, flow: Flow, exc: Exception
) -> web.StreamResponse:
    """The answer broke after its status line was sent (or the driver left while it was
    written): no Status can follow, so the connection is broken and the flow says why."""
    if isinstance(exc, ConnectionResetError):
        # The driver went away while its answer was written: its disconnect, not the upstream's.
        flow.finish(499, "client disconnected")
        return response
    if isinstance(exc, UpstreamError):
        # Break the driver's connection, as a dying apiserver would, so its client re-lists or
        # re-watches instead of waiting on a stream that will never end.
        log.warning("upstream failed mid-response audit_id=%s %s", flow.audit_id, exc.message)
        flow.finish(flow.status_code, exc.message)
    else:
        # A fault of our own mid-stream.
        log.exception("internal error mid-response audit_id=%s", flow.audit_id, exc_info=exc)
        flow.annotations[ERROR_ANNOTATION] = f"internal error: {type(exc).__name__}"
        flow.finish(500, f"internal error: {type(exc).__name__}")
    if request.transport is not None:
        request.transport.close()
    return response


async def _relay(
    request: web.BaseRequest,
    response: web.StreamResponse,
    flow: Flow,
    gk: Gatekeeper,
    answer: UpstreamResponse,
    body: AsyncIterator[bytes],
    scrub: bool = False,
) -> KubeObject | None:
    """Write the upstream's answer to the driver; the captured response object, if logged.

    ``scrub``: the read is filtered, so an error answer is rebuilt from its Status's code,
    reason, message and details alone (:func:`~gatekeeper.proxy.filtering.scoped_error`)."""
    capture = ResponseCapture(
        gk.audit_level is AuditLevel.REQUEST_RESPONSE
        and logs_bodies(flow.info)
        and not flow.long_running,
        answer.headers.get("Content-Type", ""),
    )
    if answer.status >= 400:
        head = await answer.read(_MAX_CAPTURED_ERROR)
        if scrub:
            # A HEAD answer has no body to rebuild (the apiserver sends none).
            empty = request.method == "HEAD"
            head, body = b"" if empty else scoped_error(head, answer.status), _nothing()
        flow.status_message = _message_of(head)
        await response.prepare(request)
        capture.feed(head)
        await response.write(head)
    else:
        await response.prepare(request)
        flow.response_started = datetime.now(UTC)
        if flow.long_running:
            await gk.audit.emit(build_event(flow, gk.audit_level, STAGE_STARTED))
    async for chunk in body:
        capture.feed(chunk)
        await response.write(chunk)
    await response.write_eof()
    return capture.result()


def _passed_length(
    method: str, answer: UpstreamResponse, state: WatchFilter | None, scrub: bool
) -> int | None:
    """The upstream's Content-Length, when the driver gets the body byte for byte (not
    filtered, not rebuilt, not decoded): the answer then needs no chunked framing, and no
    separate last chunk to end it."""
    if state is not None or scrub or method == "HEAD" or "Content-Encoding" in answer.headers:
        return None
    value = answer.headers.get("Content-Length", "")
    return int(value) if value.isascii() and value.isdigit() else None


async def _nothing() -> AsyncIterator[bytes]:
    empty: tuple[bytes, ...] = ()
    for chunk in empty:
        yield chunk


def _payload(body: Any) -> bytes | None:
    """The forwarded body: an encoded body's bytes as they are, anything else as JSON."""
    if body is None or isinstance(body, bytes):
        return body
    return jsoncodec.dumps(body)


def _message_of(payload: bytes) -> str:
    try:
        return str(jsoncodec.loads(payload).get("message", ""))
    except (ValueError, AttributeError):
        return ""
