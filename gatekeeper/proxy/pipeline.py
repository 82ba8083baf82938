"""The request pipeline, composed once: every request, whatever its target (``CONNECT host:443``
and ``OPTIONS *`` included), takes the same steps in the same order.

in flight → identify (the listener's :class:`~gatekeeper.listen.identity.Identifier`, handed in
as ``identify``) → screen headers → parse → audit writable → budget → decide → forward;
audit always. Each step is a function of its own module; none calls another. The one object
carried through is a :class:`~gatekeeper.audit.flow.Flow`, and the audit event is built from it
in ``finally``. There is no router and no middleware list: :func:`build_handler` is the whole
chain (kube-rbac-proxy's ``Run``, mitmproxy's ``default_addons``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from gatekeeper.audit import build_event, client_audit_id
from gatekeeper.audit.flow import Flow
from gatekeeper.errors import Refusal, UpstreamError
from gatekeeper.policy.decision import Decision, deny
from gatekeeper.proxy.answer import answer, internal_error
from gatekeeper.proxy.deciding import decide
from gatekeeper.proxy.forward import forward
from gatekeeper.proxy.state import Gatekeeper
from gatekeeper.request.headers import screen_request
from gatekeeper.request.requestinfo import parse_request
from gatekeeper.rule import Rule
from gatekeeper.types import Identity

__all__ = ["Handler", "Identify", "build_handler", "handle"]

log = logging.getLogger("gatekeeper.proxy")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Identify = Callable[[web.BaseRequest], Awaitable[Identity]]
"""Who is calling, or the Refusal (an UpstreamError when the apiserver cannot say): the
listeners' one seam into the pipeline (a layer above it, so handed in)."""


def build_handler(gatekeeper: Gatekeeper, identify: Identify) -> Handler:
    """The gatekeeper's one request handler, for aiohttp's low-level ``web.Server``."""

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        return await handle(request, gatekeeper, identify)

    return handler


async def handle(
    request: web.BaseRequest, gk: Gatekeeper, identify: Identify
) -> web.StreamResponse:
    """The whole pipeline for one request."""
    flow = Flow(
        method=request.method,
        raw_target=request.raw_path,
        source_ips=(request.remote,) if request.remote else (),
        user_agent=request.headers.get("User-Agent", ""),
        node_name=gk.node_name,
        client_audit_id=client_audit_id(request.headers),
    )
    with gk.in_flight.request():
        try:
            return await _serve(request, flow, gk, identify)
        except Refusal as refusal:
            # Refused before the engine (identity, headers, path, body): the one verdict is this.
            flow.decision = Decision(
                allowed=False,
                reason=refusal.reason,
                code=refusal.code,
                message=refusal.message,
                details=refusal.details,
                retry_after=refusal.retry_after,
                rule=refusal.rule,
            )
            return answer(flow, flow.decision)
        except UpstreamError as error:
            return _upstream_failed(flow, error)
        except Exception as exc:
            # A fault of the gatekeeper's own: a Status 500 with the Audit-Id, the traceback in
            # the log, and the event with the decision reached so far (fail closed: nothing
            # forwarded after this point).
            log.exception("internal error audit_id=%s", flow.audit_id)
            return internal_error(flow, exc)
        finally:
            if flow.completed is None:
                # Cancelled: the driver went away (or the server is stopping) mid-request.
                flow.finish(499, "client disconnected")
            await gk.audit.emit(build_event(flow, gk.audit_level))


async def _serve(
    request: web.BaseRequest, flow: Flow, gk: Gatekeeper, identify: Identify
) -> web.StreamResponse:
    flow.identity = await identify(request)
    screen_request(request.method, request.headers)
    flow.info = parse_request(request.method, request.raw_path)
    if not gk.audit.writable:
        # SECURITY: docs/operating.md#faults — fail closed: nothing is served that is not audited.
        raise Refusal(
            503,
            "the audit log cannot be written",
            "the gatekeeper cannot write its audit log (disk full or I/O error): requests "
            "are refused until it can, rather than served unaudited",
            rule=Rule.AUDIT_UNWRITABLE,
            retry_after=5,
        )
    # SECURITY: docs/operating.md#limits — one driver's requests and watches are bounded, so they
    # cannot take the place (upstream connections, memory) of another driver's: 429.
    with gk.budgets.admit(flow.identity.driver, watch=flow.long_running):
        flow.decision = await decide(request, flow, gk)
        if flow.decision.forwards:
            return await forward(request, flow, gk)
        return answer(flow, flow.decision)


def _upstream_failed(flow: Flow, error: UpstreamError) -> web.Response:
    log.warning("upstream error audit_id=%s code=%s %s", flow.audit_id, error.code, error.message)
    if flow.decision is None:
        # SECURITY: DESIGN §4.4 — what could not be read could not be checked: fail closed.
        why = f"no decision, the upstream failed: {error.message}"
        flow.decision = deny(error.code, why, rule=Rule.UPSTREAM_FAILED)
    retry_after = 1 if error.code == 503 else None
    failed = Decision(False, error.message, error.code, error.message, retry_after=retry_after)
    return answer(flow, failed)
