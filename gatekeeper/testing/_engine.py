"""The engine's conversation driven offline, for tests: plan, preview, decide, no upstream."""

from __future__ import annotations

from typing import Any

from gatekeeper.policy.decision import Decision
from gatekeeper.policy.engine import Engine
from gatekeeper.requestinfo import RequestInfo
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
) -> Decision:
    """What the proxy would decide with ``current`` as the stored object and ``proposed`` as the
    upstream's answer to a patch preview (HTTP 200), in the proxy's order of calls."""
    plan = engine.plan(identity, info, media_type)
    if isinstance(plan, Decision):
        return plan
    preview = plan.preview(body, current)
    if preview is not None and proposed is not None:
        preview = preview.answered(200, proposed)
    return engine.decide(plan, body, current, preview)


def planned_fetch(engine: Engine, identity: Identity, info: RequestInfo) -> str | None:
    """The path the engine's plan reads first (None when it reads nothing or settles at once)."""
    plan = engine.plan(identity, info)
    return None if isinstance(plan, Decision) else plan.fetch
