"""The gatekeeper's own answers: a Kubernetes Status (or the apiserver's, passed on), with the
request's Audit-Id, written on the flow for the audit event."""

from __future__ import annotations

from aiohttp import web

from gatekeeper.audit.event import ERROR_ANNOTATION
from gatekeeper.audit.flow import Flow
from gatekeeper.codec import jsoncodec
from gatekeeper.policy.decision import Decision
from gatekeeper.status import status_body

__all__ = ["answer", "internal_error"]

_JSON = "application/json"


def answer(flow: Flow, decision: Decision) -> web.Response:
    """The gatekeeper's own answer: the apiserver's Status it was given, or one it writes."""
    headers = {"Audit-Id": flow.audit_id}
    if decision.response is not None:
        body = decision.response
    else:
        extra: dict[str, object] = dict(decision.details)
        if decision.retry_after is not None:
            headers["Retry-After"] = str(decision.retry_after)
            extra["retryAfterSeconds"] = decision.retry_after
        body = status_body(decision.code, decision.message, details=extra or None)
    flow.response_object = body
    flow.finish(decision.code, decision.message)
    return web.Response(
        body=jsoncodec.dumps(body), status=decision.code, headers=headers, content_type=_JSON
    )


def internal_error(flow: Flow, exc: Exception) -> web.Response:
    """A fault of the gatekeeper's own: a Status 500 naming the Audit-Id, nothing forwarded."""
    message = (
        f"internal error in the gatekeeper ({type(exc).__name__}); nothing more was sent "
        f"upstream; see its log for audit ID {flow.audit_id}"
    )
    flow.annotations[ERROR_ANNOTATION] = f"internal error: {type(exc).__name__}"
    body = status_body(500, message)
    flow.response_object = body
    flow.finish(500, f"internal error: {type(exc).__name__}")
    return web.json_response(body, status=500, headers={"Audit-Id": flow.audit_id})
