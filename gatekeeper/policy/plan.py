"""The engine's first answer about a request it cannot settle alone: what to read first.

:meth:`Engine.plan <gatekeeper.policy.engine.Engine.plan>` screens the request once (caller,
kind, version, shape) and returns a :class:`Plan`; the driver of the conversation (the proxy,
``audit check``, ``dra-gatekeeper test``) reads ``fetch``, asks for the :class:`Preview` a patch
needs, and hands both answers to :meth:`Engine.decide <gatekeeper.policy.engine.Engine.decide>`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gatekeeper.encoded import EncodedBody
from gatekeeper.policy.encoded import encoded_preview
from gatekeeper.policy.integrity import stored_resource_version
from gatekeeper.policy.model import KindSpec, VersionSpec
from gatekeeper.policy.ownership import ownership_violation
from gatekeeper.policy.patching import APPLY, STRATEGIC_MERGE, PatchError, pin_patch
from gatekeeper.requestinfo import RequestInfo
from gatekeeper.types import Identity, KubeObject

if TYPE_CHECKING:
    from gatekeeper.policy.claims import AllocationScope

__all__ = ["PREVIEWED", "Plan", "Preview"]

PREVIEWED = frozenset({STRATEGIC_MERGE, APPLY})
"""Patch types whose result needs schema knowledge: the apiserver computes it (``dryRun=All``)."""


@dataclass(frozen=True, slots=True)
class Preview:
    """A write whose result the apiserver computes: a strategic-merge or apply patch, or a
    body only it decodes (protobuf, CBOR), pinned to the fetched object's resourceVersion.

    Built once: sent with ``dryRun=All`` to learn what it would store, then the same pinned
    ``body`` is what is forwarded (DESIGN §4.4). ``code`` and ``result`` are the upstream's
    answer to the dry run (0 and None until it is asked).
    """

    target: RequestInfo
    """The request forwarded after the decision (the driver's, canonical); its method is the
    dry run's."""
    body: Any
    """The driver's patch with the resourceVersion precondition, or the driver's encoded bytes
    (protobuf, CBOR) pinned the same way."""
    media_type: str
    code: int = 0
    result: KubeObject | None = None
    """What the patch would store; the apiserver's Status when it rejected the dry run."""

    @property
    def dry_run(self) -> RequestInfo:
        """The preview request's target: ``target`` with ``dryRun=All``."""
        return self.target.with_query("dryRun", "All")

    @property
    def rejected(self) -> bool:
        """The apiserver refused the dry run (409 conflict, 422 invalid, …)."""
        return self.code >= 400

    def answered(self, code: int, result: KubeObject) -> Preview:
        """This preview with the upstream's answer."""
        return replace(self, code=code, result=result)


@dataclass(frozen=True, slots=True)
class Plan:
    """A request that passed the request-level rules; what the engine needs before deciding."""

    identity: Identity
    info: RequestInfo
    media_type: str
    """The request body's content type (a patch's type)."""
    kind: KindSpec
    version: VersionSpec
    node_name: str
    fetch: str | None
    """The path of the stored object to read first; None when nothing is read."""
    scope: AllocationScope | None = None
    """For a kind scoped by allocation (DESIGN §4.3): what the caller may see."""
    answer_from_fetch: bool = False
    """A plain-JSON get of a NodeLocal object: answered with the object read at ``fetch``."""

    @property
    def driver(self) -> str:
        return self.identity.driver

    @property
    def previews(self) -> bool:
        """Whether the patch's result is asked of the upstream (a strategic-merge or apply
        patch of a stored object the caller may touch: see :meth:`preview`)."""
        return self.info.verb == "patch" and self.media_type in PREVIEWED

    def preview(self, body: Any, current: KubeObject | None) -> Preview | None:
        """The dry-run request a strategic-merge or apply patch of ``current``, or a body only
        the apiserver decodes, needs; or None.

        Only for a stored object the caller may touch: nothing about another driver's object
        is asked of the apiserver. A patch that cannot be pinned is refused by ``decide``.
        """
        if isinstance(body, EncodedBody):
            return encoded_preview(self, body, current)
        if not self.previews or current is None:
            return None
        if not isinstance(body, dict) or not self.owns(current):
            return None
        try:
            pinned = pin_patch(self.media_type, body, stored_resource_version(current))
        except PatchError:
            return None
        return Preview(self.info, pinned, self.media_type)

    def owns(self, stored: KubeObject) -> bool:
        """Whether the stored object is the caller's on this node (in its scope)."""
        if self.scope is not None:
            return self.scope(stored)
        violation = ownership_violation(
            self.version, stored, self.driver, self.node_name, stored=True
        )
        return violation is None
