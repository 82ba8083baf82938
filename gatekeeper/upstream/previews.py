"""Previews: ask the upstream what a write would store, with ``dryRun=All``.

Strategic-merge and apply patches depend on schema knowledge (list merge keys, ``$patch``
directives, field ownership), and protobuf and CBOR bodies on API types, that the gatekeeper
does not compile in, so the apiserver computes the result. The request is the plan's
:class:`~gatekeeper.policy.plan.Preview`, pinned to the version that was fetched (DESIGN §4.4);
the same pinned body is forwarded after the check.
"""

from __future__ import annotations

from gatekeeper.policy.plan import Preview
from gatekeeper.upstream.session import Upstream, request

__all__ = ["run_preview"]


async def run_preview(upstream: Upstream, preview: Preview) -> Preview:
    """``preview`` with the upstream's answer: what the patch would store, or the apiserver's
    Status when it rejects it (the engine then passes that answer to the driver)."""
    target = preview.dry_run.target
    method, body, media_type = preview.target.method, preview.body, preview.media_type
    status, result = await request(upstream, method, target, body, media_type)
    return preview.answered(status, result)
