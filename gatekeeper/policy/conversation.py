"""The engine's one conversation, sans I/O: screen, read the body, plan, fetch, preview, decide.

:func:`conversation` is a generator (mitmproxy's layers work the same way): it yields each thing
it needs read — the request body (:data:`BODY`), the stored object (:class:`Fetch`), the dry run a
patch or an encoded body needs (:class:`~gatekeeper.policy.plan.Preview`) — and returns the one
:class:`~gatekeeper.policy.decision.Decision`. Whoever drives it answers each step with its own
readers: the proxy with the driver's request and the upstream, ``audit check`` with the log,
tests with what they are given (:func:`converse`). So all three decide by the same calls in the
same order.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Final

from gatekeeper.policy.decision import Decision
from gatekeeper.policy.encoded import encoded_preview
from gatekeeper.policy.engine import Engine
from gatekeeper.policy.model import KindRule
from gatekeeper.policy.plan import Plan, Preview
from gatekeeper.policy.stored import predict
from gatekeeper.request.encoded import EncodedBody
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import Identity, KubeObject

__all__ = [
    "BODY",
    "Answer",
    "Body",
    "Conversation",
    "Fetch",
    "Step",
    "conversation",
    "converse",
    "preview_of",
]

_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Body:
    """Step: read the request body; answered with ``(media_type, decoded body or None)``.

    Asked only once the request itself passed the request-level rules: a request refused on
    what it names (kind, verb, driver) is refused whatever its body is, which is never read."""


BODY: Final = Body()


@dataclass(frozen=True, slots=True)
class Fetch:
    """Step: read the stored object at ``path``; answered with it, or None when it is absent."""

    path: str


Step = Body | Fetch | Preview
"""What the conversation asks its driver for."""
Answer = tuple[str, Any] | KubeObject | Preview | None
"""What the driver answers a step with."""
Conversation = Generator[Step, Answer, Decision]


def conversation(
    engine: Engine, identity: Identity, info: RequestInfo, *, plain_json: bool = False
) -> Conversation:
    """Decide ``info`` for ``identity``, asking the driver for what to read as it goes.

    ``plain_json``: the driver accepts the plain JSON object the gatekeeper reads (its
    ``Accept`` header, :func:`~gatekeeper.request.headers.accepts_plain_json`), so a get may be
    answered from that read."""
    screened = engine.screen(identity, info, plain_json=plain_json)
    if isinstance(screened, Decision) and not screened.allowed:
        return screened
    read = yield BODY
    assert isinstance(read, tuple)
    media_type, body = read
    if isinstance(screened, Decision):
        return screened
    plan = engine.accept(screened, media_type, body)
    if isinstance(plan, Decision):
        return plan
    current: KubeObject | None = None
    if plan.fetch is not None:
        fetched = yield Fetch(plan.fetch)
        assert fetched is None or isinstance(fetched, dict)
        current = fetched
    proposed: Preview | None = None
    preview = preview_of(plan, body, current)
    if isinstance(preview, Decision):
        return preview
    if preview is not None:
        answered = yield preview
        assert isinstance(answered, Preview)
        proposed = answered
    return engine.decide(plan, body, current, proposed)


def preview_of(plan: Plan, body: Any, current: KubeObject | None) -> Preview | Decision | None:
    """The dry-run request a patch of ``current`` decided on the apiserver's result
    (:func:`~gatekeeper.policy.stored.predict`), or a body only the apiserver decodes, needs;
    None when none does; or the refusal a patch gets before any dry run.

    Only for a stored object the caller may touch: nothing about another driver's object is
    asked of the apiserver; and nothing ever under the gatekeeper's credentials for a kind
    forwarded under the driver's own (DESIGN §4.3a: the apiserver decodes and decides it).
    """
    if plan.kind.rule is KindRule.DRIVER_CREDENTIALS:
        return None
    if isinstance(body, EncodedBody):
        return encoded_preview(plan, body, current)
    if plan.info.verb != "patch" or current is None or not plan.owns(current):
        return None
    predicted = predict(plan, body, current)
    return predicted if isinstance(predicted, Decision) else predicted.preview


def converse(
    talk: Conversation,
    *,
    body: Callable[[], tuple[str, Any]],
    fetch: Callable[[str], KubeObject | None],
    preview: Callable[[Preview], Preview],
) -> Decision:
    """Drive ``talk`` with synchronous readers (offline: ``audit check``, tests); its Decision."""
    try:
        step = next(talk)
        while True:
            answer: Answer
            if isinstance(step, Body):
                answer = body()
            elif isinstance(step, Fetch):
                answer = fetch(step.path)
            else:
                answer = preview(step)
            step = talk.send(answer)
    except StopIteration as done:
        decision: Decision = done.value
        return decision
