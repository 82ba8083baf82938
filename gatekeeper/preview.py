"""Patch preview: ask the upstream what a strategic-merge or apply patch would store.

Those patch types depend on schema knowledge (list merge keys, ``$patch`` directives, field
ownership) that the gatekeeper does not compile in, so the apiserver computes the result with
``dryRun=All``, pinned to the version that was fetched (DESIGN §4.4).
"""

from __future__ import annotations

from typing import Any

from gatekeeper.errors import Refusal, UpstreamError
from gatekeeper.policy.integrity import stored_resource_version
from gatekeeper.policy.patching import PatchError, pin_patch
from gatekeeper.requestinfo import RequestInfo
from gatekeeper.types import KubeObject
from gatekeeper.upstream import Upstream

__all__ = ["preview_patch"]


async def preview_patch(
    upstream: Upstream, info: RequestInfo, media_type: str, patch: Any, current: KubeObject
) -> KubeObject:
    """The object a strategic-merge or apply patch of ``current`` would store."""
    resource_version = stored_resource_version(current)
    try:
        pinned = pin_patch(media_type, patch, resource_version)
    except PatchError as exc:
        raise Refusal(422, str(exc)) from exc
    target = info.with_query("dryRun", "All")
    status, result = await upstream.call("PATCH", target.target, pinned, media_type)
    if status >= 400:
        # The real patch would fail the same way; the driver gets the apiserver's answer.
        raise UpstreamError(status, str(result.get("message", "patch preview failed")))
    return result
