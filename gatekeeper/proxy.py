"""The request pipeline, composed in one place: identity → parse → decide → forward; audit always.

Each step is a function of its own module; none calls another. The one object carried through
is a :class:`~gatekeeper.flow.Flow`, and the audit event is built from it in ``finally``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from gatekeeper import jsoncodec
from gatekeeper.audit import (
    STAGE_STARTED,
    AuditLevel,
    AuditSink,
    build_event,
    client_audit_id,
    logs_bodies,
)
from gatekeeper.audit.capture import ResponseCapture
from gatekeeper.audit.event import ERROR_ANNOTATION
from gatekeeper.body import JSON, decode_body, read_limited
from gatekeeper.encoded import ENCODED_MEDIA_TYPES, read_encoded
from gatekeeper.errors import Refusal, UpstreamError
from gatekeeper.filtering import PLAIN_JSON, scoped_chunks, scoped_error
from gatekeeper.flow import Flow, Forwarded
from gatekeeper.headers import (
    accepts_plain_json,
    forwarded_request_headers,
    response_headers,
    screen_request,
)
from gatekeeper.identity import Identity, bearer_token, identify, token_identity
from gatekeeper.limits import DriverBudgets
from gatekeeper.paging import PageOpener, prime_listing, prime_watch, upstream_target
from gatekeeper.policy import Decision, Engine
from gatekeeper.policy.decision import deny
from gatekeeper.policy.plan import Plan
from gatekeeper.preview import run_preview
from gatekeeper.requestinfo import RequestInfo, parse_request
from gatekeeper.scoped import DROPPED_ANNOTATION, WatchFilter
from gatekeeper.status import status_body
from gatekeeper.tokenreview import TokenReviewer
from gatekeeper.types import KubeObject
from gatekeeper.upstream import Upstream, UpstreamResponse

__all__ = [
    "GATEKEEPER",
    "Gatekeeper",
    "build_app",
    "decide",
    "forward",
    "handle",
    "identify_request",
    "plan_request",
    "read_body",
]

log = logging.getLogger("gatekeeper.proxy")

_BODY_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
_MAX_CAPTURED_ERROR = 64 * 1024
_JSON = "application/json"


@dataclass(slots=True)
class Gatekeeper:
    """What the pipeline needs, built once by the server and shared by every request."""

    engine: Engine
    upstream: Upstream
    audit: AuditSink
    audit_level: AuditLevel = AuditLevel.METADATA
    socket_drivers: dict[str, str] = field(default_factory=dict)
    budgets: DriverBudgets = field(default_factory=DriverBudgets)
    """Per-driver in-flight and watch budgets (and the limits they come from)."""
    tokens: TokenReviewer | None = None
    """Reviews the bearer tokens of the token listener (DESIGN §4.2); None without one."""
    token_ports: set[int] = field(default_factory=set)
    """Local ports of the token listener: a connection to one shows a token, not a cert."""

    @property
    def node_name(self) -> str:
        return self.engine.node_name


GATEKEEPER = web.AppKey("gatekeeper", Gatekeeper)


def build_app(gatekeeper: Gatekeeper, outer: Sequence[Any] = ()) -> web.Application:
    """The gatekeeper's aiohttp app; ``outer`` middlewares (in-flight drain, metrics) wrap
    every request, those the router cannot match included."""
    app = web.Application(client_max_size=0, middlewares=[*outer, _any_target])
    app[GATEKEEPER] = gatekeeper
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@web.middleware
async def _any_target(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every request goes through the pipeline, which answers with a Status and an audit event,
    also those the router cannot match (not aiohttp's text/plain 404): ``CONNECT host:443``,
    ``OPTIONS *``, and ``CONNECT /api`` (aiohttp reads a CONNECT target as an authority, so
    even a path does not match the catch-all route)."""
    if request.match_info.http_exception is not None:
        return await handle(request)
    return await handler(request)  # type: ignore[no-any-return]


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
        flow.identity = await identify_request(request, gk)
        screen_request(request.method, request.headers)
        flow.info = parse_request(request.method, request.raw_path)
        if not getattr(gk.audit, "writable", True):
            # SECURITY: README "Faults" — fail closed: nothing is served that is not audited.
            raise Refusal(
                503,
                "the audit log cannot be written",
                "the gatekeeper cannot write its audit log (disk full or I/O error): requests "
                "are refused until it can, rather than served unaudited",
                retry_after=5,
            )
        # SECURITY: README "Limits" — one driver's requests and watches are bounded, so they
        # cannot take the place (upstream connections, memory) of another driver's: 429.
        with gk.budgets.admit(flow.identity.driver, watch=flow.long_running):
            plan = plan_request(gk, flow, request.headers.get("Accept", ""))
            if isinstance(plan, Decision) and not plan.allowed:
                # Refused on the request alone (a kind the policy does not allow, a verb, a
                # driver): said as such, whatever the body is, which is never read.
                flow.decision = plan
                return _answer(flow, plan)
            timeout = gk.budgets.limits.body_timeout
            flow.media_type, flow.body = await read_body(request, flow.info, timeout)
            flow.decision = await decide(gk, flow, request.headers.get("Accept", ""))
            if flow.decision.forwards:
                return await forward(request, flow, gk)
            return _answer(flow, flow.decision)
    except Refusal as refusal:
        # Refused before the engine (identity, headers, path, body): the one verdict is this.
        flow.decision = Decision(
            allowed=False,
            reason=refusal.reason,
            code=refusal.code,
            message=refusal.message,
            details=refusal.details,
            retry_after=refusal.retry_after,
        )
        return _answer(flow, flow.decision)
    except UpstreamError as error:
        log.warning(
            "upstream error audit_id=%s code=%s %s", flow.audit_id, error.code, error.message
        )
        if flow.decision is None:
            # SECURITY: DESIGN §4.4 — what could not be read could not be checked: fail closed.
            flow.decision = deny(error.code, f"no decision, the upstream failed: {error.message}")
        retry_after = 1 if error.code == 503 else None
        failed = Decision(False, error.message, error.code, error.message, retry_after=retry_after)
        return _answer(flow, failed)
    except Exception as exc:
        # A fault of the gatekeeper's own: a Status 500 with the Audit-Id, the traceback in the
        # log, and the event with the decision reached so far (fail closed: nothing forwarded
        # after this point).
        log.exception("internal error audit_id=%s", flow.audit_id)
        return _internal_error(flow, exc)
    finally:
        if flow.completed is None:
            # Cancelled: the driver went away (or the server is stopping) mid-request.
            flow.finish(499, "client disconnected")
        await gk.audit.emit(build_event(flow, gk.audit_level))


async def identify_request(request: web.Request, gk: Gatekeeper) -> Identity:
    """Who is calling: the socket directory, the verified client certificate, or on the token
    listener the service account of the bearer token (reviewed, cached), whose connection is
    then counted as that driver's (README, "Limits")."""
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if gk.tokens is None or not isinstance(sockname, tuple) or sockname[1] not in gk.token_ports:
        return identify(transport, gk.socket_drivers)
    outcome = await gk.tokens.review(bearer_token(request.headers))
    identity = token_identity(outcome, gk.engine.policy, gk.node_name)
    # The connection's protocol (connections.py) moves it from the listener's unauthenticated
    # bucket to the driver's count; looked up, not imported: connections.py builds on this.
    attribute = getattr(request.protocol, "attribute", None)
    if attribute is not None and (why := attribute(identity.driver)):
        raise Refusal(429, "too many connections", f"too many connections: {why}", retry_after=1)
    return identity


def plan_request(gk: Gatekeeper, flow: Flow, accept: str = "") -> Plan | Decision:
    """The request-level rules (kind, verb, driver), before the body is read: planned as JSON,
    so that only what the request itself names can refuse it here; its encoding is judged
    once the body is read (:func:`decide` plans again with the body's media type)."""
    assert flow.identity is not None and flow.info is not None
    plain_json = accepts_plain_json(accept)
    return gk.engine.plan(flow.identity, flow.info, JSON, plain_json=plain_json)


async def decide(gk: Gatekeeper, flow: Flow, accept: str = "") -> Decision:
    """The engine's conversation: plan, read what it needs, decide."""
    assert flow.identity is not None and flow.info is not None
    plain_json = accepts_plain_json(accept)
    plan = gk.engine.plan(flow.identity, flow.info, flow.media_type, plain_json=plain_json)
    if isinstance(plan, Decision):
        return plan
    if plan.fetch is not None:
        flow.current = await gk.upstream.fetch(plan.fetch)
    if (preview := plan.preview(flow.body, flow.current)) is not None:
        flow.proposed = await run_preview(gk.upstream, preview)
    return gk.engine.decide(plan, flow.body, flow.current, flow.proposed)


async def read_body(
    request: web.Request, info: RequestInfo, timeout: float | None = None
) -> tuple[str, Any]:
    """The media type and decoded body of a writing verb (None when absent); 415/413/408/400."""
    media_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if not info.is_resource_request or info.verb not in _BODY_VERBS:
        return media_type, None
    chunks = request.content.iter_chunked(64 * 1024)
    raw = await (read_limited(chunks) if timeout is None else read_limited(chunks, timeout=timeout))
    if not raw:
        return media_type, None
    if media_type in ENCODED_MEDIA_TYPES:
        encoded = read_encoded(raw, media_type, info.verb)
        # A protobuf DeleteOptions body is read here and goes on as the JSON it stands for.
        return (JSON, encoded) if isinstance(encoded, dict) else (media_type, encoded)
    media_type, decoded = decode_body(raw, media_type, patch=info.verb == "patch")
    if not isinstance(decoded, dict) and not (info.verb == "patch" and isinstance(decoded, list)):
        raise Refusal(400, "request body must be a JSON object (or a JSON patch list)")
    return media_type, decoded


async def forward(request: web.Request, flow: Flow, gk: Gatekeeper) -> web.StreamResponse:
    """Send the decided request upstream and stream the answer back as it arrives."""
    decision = flow.decision
    assert decision is not None and decision.target is not None and flow.identity is not None
    payload = _payload(decision.body)
    media_type = None if payload is None else decision.media_type
    headers = forwarded_request_headers(
        request.headers, audit_id=flow.audit_id, content_type=media_type
    )
    if decision.filter is None:
        return await _exchange(request, flow, gk, decision.target, headers, payload, None)
    # SECURITY: DESIGN §4.3 — a kind scoped object by object is filtered on full objects:
    # a Table or metadata-only answer cannot be, so it is never asked for.
    headers["Accept"] = PLAIN_JSON
    target = upstream_target(decision.target)
    pages = _pages(gk.upstream, headers)
    driver = flow.identity.driver
    state = WatchFilter(decision.filter)  # counts what a get or list drops
    if flow.long_running and (listing := prime_listing(target)) is not None:
        # SECURITY: README "Filtered reads" — a watch's prime is a list read like any other:
        # it takes one of the driver's requests in flight and one of its filtered-read turns.
        with gk.budgets.admit(driver, watch=False):
            async with gk.budgets.filtered_read(driver):
                state = await prime_watch(pages, listing, decision.filter)
    if target.verb != "list":
        return await _exchange(request, flow, gk, target, headers, payload, (state, pages))
    async with gk.budgets.filtered_read(driver):
        return await _exchange(request, flow, gk, target, headers, payload, (state, pages))


def _pages(upstream: Upstream, headers: dict[str, str]) -> PageOpener:
    """Opens further pages of a filtered list with the request's own headers."""

    def page(info: RequestInfo) -> AbstractAsyncContextManager[UpstreamResponse]:
        return upstream.stream("GET", info.target, headers, None, long_running=False)

    return page


async def _exchange(
    request: web.Request,
    flow: Flow,
    gk: Gatekeeper,
    target: RequestInfo,
    headers: dict[str, str],
    payload: bytes | None,
    filtered: tuple[WatchFilter, PageOpener] | None,
) -> web.StreamResponse:
    """The upstream round trip of :func:`forward`, filtered when ``filtered`` says how."""
    assert flow.decision is not None
    media_type = None if payload is None else flow.decision.media_type
    flow.forwarded = Forwarded(target.method, target.target, media_type)
    response: web.StreamResponse | None = None
    try:
        async with gk.upstream.stream(
            target.method, target.target, headers, payload, long_running=flow.long_running
        ) as answer:
            flow.upstream_audit_id = answer.headers.get("Audit-Id", "")
            flow.status_code = answer.status
            body = answer.chunks()
            if answer.status < 400 and filtered is not None:
                state, pages = filtered
                keep = state.keep
                scoped = await scoped_chunks(target, body, keep, state, pages)
                if isinstance(scoped, Decision):
                    # The object left the driver's scope after the engine's read: one 404.
                    flow.decision = scoped
                    return _answer(flow, scoped)
                body = scoped
            response = web.StreamResponse(
                status=answer.status,
                headers=response_headers(answer.headers, audit_id=flow.audit_id),
            )
            scrub = filtered is not None
            flow.response_object = await _relay(request, response, flow, gk, answer, body, scrub)
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
    except ConnectionResetError:
        # The driver went away while its answer was written: its disconnect, not the upstream's.
        if response is None:
            raise
        flow.finish(499, "client disconnected")
        return response
    except Exception as exc:
        if response is None or not response.prepared:
            raise
        # A fault of our own mid-stream: no Status can follow the status line; break it.
        log.exception("internal error mid-response audit_id=%s", flow.audit_id)
        flow.annotations[ERROR_ANNOTATION] = f"internal error: {type(exc).__name__}"
        flow.finish(500, f"internal error: {type(exc).__name__}")
        if request.transport is not None:
            request.transport.close()
        return response
    finally:
        if filtered is not None and filtered[0].dropped:
            flow.annotations[DROPPED_ANNOTATION] = filtered[0].annotation()
    flow.finish(answer.status)
    return response


async def _relay(
    request: web.Request,
    response: web.StreamResponse,
    flow: Flow,
    gk: Gatekeeper,
    answer: UpstreamResponse,
    body: AsyncIterator[bytes],
    scrub: bool = False,
) -> KubeObject | None:
    """Write the upstream's answer to the driver; the captured response object, if logged.

    ``scrub``: the read is filtered, so an error answer is rebuilt from its Status's code,
    reason, message and details alone (:func:`~gatekeeper.filtering.scoped_error`)."""
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


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield


def _answer(flow: Flow, answer: Decision) -> web.Response:
    """The gatekeeper's own answer: the apiserver's Status it was given, or one it writes."""
    headers = {"Audit-Id": flow.audit_id}
    if answer.response is not None:
        body = answer.response
    else:
        extra: dict[str, object] = dict(answer.details)
        if answer.retry_after is not None:
            headers["Retry-After"] = str(answer.retry_after)
            extra["retryAfterSeconds"] = answer.retry_after
        body = status_body(answer.code, answer.message, details=extra or None)
    flow.response_object = body
    flow.finish(answer.code, answer.message)
    return web.Response(
        body=jsoncodec.dumps(body), status=answer.code, headers=headers, content_type=_JSON
    )


def _internal_error(flow: Flow, exc: Exception) -> web.Response:
    message = (
        f"internal error in the gatekeeper ({type(exc).__name__}); nothing more was sent "
        f"upstream; see its log for audit ID {flow.audit_id}"
    )
    flow.annotations[ERROR_ANNOTATION] = f"internal error: {type(exc).__name__}"
    body = status_body(500, message)
    flow.response_object = body
    flow.finish(500, f"internal error: {type(exc).__name__}")
    return web.json_response(body, status=500, headers={"Audit-Id": flow.audit_id})


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
