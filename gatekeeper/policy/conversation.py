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
from gatekeeper.policy.integrity import stored_resource_version
from gatekeeper.policy.patching import PatchError, pin_patch
from gatekeeper.policy.plan import Plan, Preview
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
    if (preview := preview_of(plan, body, current)) is not None:
        answered = yield preview
        assert isinstance(answered, Preview)
        proposed = answered
    return engine.decide(plan, body, current, proposed)


def preview_of(plan: Plan, body: Any, current: KubeObject | None) -> Preview | None:
    """The dry-run request a strategic-merge or apply patch of ``current``, or a body only the
    apiserver decodes, needs; or None.

    Only for a stored object the caller may touch: nothing about another driver's object is
    asked of the apiserver. A patch that cannot be pinned is refused by ``decide``.
    """
    if isinstance(body, EncodedBody):
        return encoded_preview(plan, body, current)
    if not plan.previews or current is None:
        return None
    if not isinstance(body, dict) or not plan.owns(current):
        return None
    try:
        pinned = pin_patch(plan.media_type, body, stored_resource_version(current))
    except PatchError:
        return None
    return Preview(plan.info, pinned, plan.media_type)


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
