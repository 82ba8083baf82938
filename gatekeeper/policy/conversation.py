"""The engine's one conversation, sans I/O: screen, read the body, plan, fetch, preview, decide.

:func:`conversation` is a generator (mitmproxy's layers work the same way): it yields each thing
it needs read — the request body (:data:`BODY`), the stored object (:class:`Fetch`), the dry run
a write is decided on when the apiserver alone knows what it stores
(:class:`~gatekeeper.policy.plan.Preview`, from the write's one prediction,
:func:`~gatekeeper.policy.stored.predict`) — and returns the one
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
from gatekeeper.policy.engine import Engine
from gatekeeper.policy.plan import Preview
from gatekeeper.policy.stored import predict
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
]


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
    # What the write stores, predicted once (stored.predict): refused before anything is
    # asked, known here, or asked of the apiserver; the engine decides on this one prediction.
    stored = predict(plan, body, current)
    if isinstance(stored, Decision):
        return stored
    if stored is not None and stored.preview is not None:
        answer = yield stored.preview
        assert isinstance(answer, Preview)
        stored = stored.answered(answer)
    return engine.decide(plan, body, current, stored)


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
