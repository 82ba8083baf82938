"""The values of the engine's conversation: the :class:`Plan` of what to read first, and the
:class:`Preview` of a write whose result the apiserver computes.

A leaf of the policy package: the logic modules (claims, integrity, encoded) and the
conversation (:mod:`gatekeeper.policy.conversation`) import these values; they import none of
that logic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

from gatekeeper.policy.admission import CelContext
from gatekeeper.policy.model import KindSpec, VersionSpec
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.rule import Violation
from gatekeeper.types import Identity, KubeObject

__all__ = ["Ownership", "Plan", "Preview"]


@dataclass(frozen=True, slots=True)
class Preview:
    """A write whose result the apiserver computes: a patch whose result is decided on the
    apiserver's (:mod:`gatekeeper.policy.stored`), or a body only it decodes (protobuf, CBOR),
    pinned to the fetched object's resourceVersion.

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


class Ownership(Protocol):
    """Whose an object is under a kind's rule, for one caller (:mod:`gatekeeper.policy.owners`,
    :class:`~gatekeeper.policy.claims.AllocationScope`)."""

    @property
    def hidden(self) -> bool:
        """An object that is not the caller's reads as absent (404), not as forbidden (403)."""

    def stored(self, obj: KubeObject) -> Violation | None:
        """Why the stored ``obj`` is not the caller's to read or touch; None when it is."""

    def written(self, obj: KubeObject, old: KubeObject | None) -> Violation | None:
        """Why ``obj`` may not be stored (over ``old``, when one is); None when it may."""


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
    owner: Ownership
    """Whose an object is: checked on the stored object, and on what a write would store."""
    context: CelContext
    """The CEL view of the request (its ``request`` and ``variables``)."""
    answer_from_fetch: bool = False
    """A plain-JSON get: answered with the object read at ``fetch``, the one the decision was
    made on."""
    unread: bool = False
    """An update decided without reading the stored object: its body names the caller as owner
    in fields the apiserver refuses to change, and carries the resourceVersion it was read at
    (docs/security.md, "Updates without a read")."""
    decoded: bool = False
    """The body decided on is the apiserver's decoding of the driver's protobuf or CBOR bytes
    (a dry run's answer), not the driver's own JSON: its apiserver-maintained fields are the
    apiserver's (:mod:`gatekeeper.policy.encoded`)."""

    @property
    def driver(self) -> str:
        return self.identity.driver

    def owns(self, stored: KubeObject) -> bool:
        """Whether the stored object is the caller's (in its scope)."""
        return self.owner.stored(stored) is None
