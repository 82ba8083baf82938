"""The engine's conversation driven offline, for tests: the proxy's calls, no upstream."""

from __future__ import annotations

from typing import Any

from gatekeeper.policy.conversation import conversation, converse
from gatekeeper.policy.decision import Decision
from gatekeeper.policy.engine import Engine
from gatekeeper.policy.plan import Preview
from gatekeeper.request.headers import accepts_plain_json
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.types import Identity, KubeObject

__all__ = ["decide_offline", "planned_fetch"]

_JSON = "application/json"


def decide_offline(
    engine: Engine,
    identity: Identity,
    info: RequestInfo,
    body: Any = None,
    current: KubeObject | None = None,
    *,
    media_type: str = _JSON,
    proposed: KubeObject | None = None,
    accept: str = "",
) -> Decision:
    """What the proxy would decide with ``current`` as the stored object, ``proposed`` as the
    upstream's answer to a patch preview (HTTP 200), and ``accept`` as the driver's ``Accept``
    header (empty, as a plain client sends it: a plain-JSON get is answered from the read)."""

    def answer_preview(preview: Preview) -> Preview:
        return preview if proposed is None else preview.answered(200, proposed)

    talk = conversation(engine, identity, info, plain_json=accepts_plain_json(accept))
    return converse(
        talk,
        body=lambda: (media_type, body),
        fetch=lambda path: current,
        preview=answer_preview,
    )


def planned_fetch(engine: Engine, identity: Identity, info: RequestInfo) -> str | None:
    """The path the engine's plan reads first (None when it reads nothing or settles at once)."""
    plan = engine.plan(identity, info)
    return None if isinstance(plan, Decision) else plan.fetch
