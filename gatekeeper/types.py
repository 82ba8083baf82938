"""Value types shared across modules, with no dependencies: Kubernetes objects stay plain JSON
dicts, and the caller is a frozen :class:`Identity` (what the engine consumes, DESIGN §3)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.listenerkind import ListenerKind

__all__ = [
    "DRIVERS_GROUP",
    "NODE_NAME_EXTRA",
    "POD_NAME_EXTRA",
    "POD_UID_EXTRA",
    "Identity",
    "KubeObject",
    "UserInfo",
]

DRIVERS_GROUP = "dra-gatekeeper:drivers"
"""The group of every identified driver (audit ``user.groups``)."""
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""The node a pod-bound service-account token names (KEP-4193), in its TokenReview's extra and
in the audit event's ``user.extra``."""

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
_SA_PREFIX = "system:serviceaccount:"

KubeObject = dict[str, Any]
"""A Kubernetes object as decoded JSON. The gatekeeper never compiles in API types."""


@dataclass(frozen=True, slots=True)
class UserInfo:
    """Who the apiserver says holds a token (a TokenReview's ``status.user``): what a
    ValidatingAdmissionPolicy reads as ``request.userInfo``."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def first_extra(self, key: str) -> str | None:
        values = self.extra.get(key)
        return values[0] if values else None


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller. ``driver`` is the DRA driver name (audit ``user.username``)."""

    driver: str
    transport: ListenerKind
    """The listener the caller came through (audit ``dra-gatekeeper.io/transport``)."""
    peer: Mapping[str, str] = field(default_factory=dict)
    """Peer facts for the audit event: uid/gid/pid (Unix) or certificate serial (mTLS)."""
    user: UserInfo | None = None
    """The apiserver's view of the caller's ServiceAccount token (token listener); None for a
    Unix socket or a client certificate, which the apiserver never sees."""

    @property
    def service_account(self) -> tuple[str, str] | None:
        """(namespace, name) of the caller's ServiceAccount, when its token showed one."""
        if self.user is None or not self.user.username.startswith(_SA_PREFIX):
            return None
        namespace, _, name = self.user.username.removeprefix(_SA_PREFIX).partition(":")
        return (namespace, name) if namespace and name else None

    @property
    def pod(self) -> tuple[str, str] | None:
        """(name, uid) of the pod the caller's token is bound to, when it names one."""
        if self.user is None:
            return None
        name, uid = self.user.first_extra(POD_NAME_EXTRA), self.user.first_extra(POD_UID_EXTRA)
        return (name, uid or "") if name else None
