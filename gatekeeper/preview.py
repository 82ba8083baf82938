"""Patch preview: ask the upstream what a strategic-merge or apply patch would store.

Those patch types depend on schema knowledge (list merge keys, ``$patch`` directives, field
ownership) that the gatekeeper does not compile in, so the apiserver computes the result with
``dryRun=All``. The request is the plan's :class:`~gatekeeper.policy.plan.Preview`, pinned to
the version that was fetched (DESIGN §4.4); the same pinned patch is forwarded after the check.
"""

from __future__ import annotations

from gatekeeper.policy.plan import Preview
from gatekeeper.upstream import Upstream

__all__ = ["preview_patch"]


async def preview_patch(upstream: Upstream, preview: Preview) -> Preview:
    """``preview`` with the upstream's answer: what the patch would store, or the apiserver's
    Status when it rejects it (the engine then passes that answer to the driver)."""
    status, result = await upstream.request(
        "PATCH", preview.dry_run.target, preview.body, preview.media_type
    )
    return preview.answered(status, result)
