"""The step before forwarding: the engine's conversation driven with the driver's request and
the upstream as its readers."""

from __future__ import annotations

from aiohttp import web

from gatekeeper.audit.flow import Flow
from gatekeeper.policy.conversation import Answer, Body, Fetch, conversation
from gatekeeper.policy.decision import Decision
from gatekeeper.proxy.requestbody import read_body
from gatekeeper.proxy.state import Gatekeeper
from gatekeeper.request.body import MAX_BODY_BYTES
from gatekeeper.request.headers import accepts_plain_json
from gatekeeper.upstream.previews import run_preview
from gatekeeper.upstream.session import fetch

__all__ = ["decide"]


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
                driver, declared = flow.identity.driver, request.content_length
                if declared:  # (one past the largest body: that is refused unread)
                    await gk.budgets.body(driver, min(declared, MAX_BODY_BYTES + 1))
                timeout = gk.budgets.limits.body_timeout
                flow.media_type, flow.body = await read_body(request, flow.info, timeout)
                if declared is None:
                    gk.budgets.charge(driver, request.content.total_bytes)
                answer = (flow.media_type, flow.body)
            elif isinstance(step, Fetch):
                flow.current = answer = await fetch(gk.upstream, step.path)
            else:
                flow.proposed = answer = await run_preview(gk.upstream, step)
    except StopIteration as done:
        decision: Decision = done.value
        return decision
