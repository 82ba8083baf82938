"""Value types shared across modules, with no dependencies: Kubernetes objects stay plain JSON
dicts, and the caller is a frozen :class:`Identity` (what the engine consumes, DESIGN §3)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.listenerkind import ListenerKind

__all__ = ["DRIVERS_GROUP", "NODE_NAME_EXTRA", "Identity", "JSONValue", "KubeObject"]

DRIVERS_GROUP = "dra-gatekeeper:drivers"
"""The group of every identified driver (audit ``user.groups``)."""
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""The node a pod-bound service-account token names (KEP-4193), in its TokenReview's extra and
in the audit event's ``user.extra``."""

KubeObject = dict[str, Any]
"""A Kubernetes object as decoded JSON. The gatekeeper never compiles in API types."""

JSONValue = Any


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller. ``driver`` is the DRA driver name (audit ``user.username``)."""

    driver: str
    transport: ListenerKind
    """The listener the caller came through (audit ``dra-gatekeeper.io/transport``)."""
    peer: Mapping[str, str] = field(default_factory=dict)
    """Peer facts for the audit event: uid/gid/pid (Unix) or certificate serial (mTLS)."""
