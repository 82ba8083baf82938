"""Request paths of the embedded API server → what they address (kind, version, scope, name)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gatekeeper.apiserver._errors import path_not_found
from gatekeeper.apiserver._kinds import ServedKind

__all__ = ["Target", "resolve_resource_path"]


@dataclass(frozen=True, slots=True)
class Target:
    """A resource path: ``namespace`` is None for an all-namespaces collection of a namespaced
    kind and ``""`` for a cluster-scoped kind; ``name`` is ``""`` for a collection."""

    kind: ServedKind
    version: str
    namespace: str | None
    name: str = ""
    subresource: str = ""

    @property
    def resource_key(self) -> tuple[str, str]:
        """``(group, resource)`` as the store keys objects."""
        return (self.kind.group, self.kind.resource)


def _bad_segment(segment: str) -> bool:
    return segment in ("", ".", "..") or "/" in segment or "%" in segment


def resolve_resource_path(
    group: str,
    version: str,
    segments: list[str],
    kinds: Mapping[tuple[str, str], ServedKind],
) -> Target:
    """Resolve the segments after ``/apis/<group>/<version>`` (or ``/api/v1``); 404 if unserved."""
    namespace: str | None = None
    rest = segments
    if (
        len(segments) >= 3
        and segments[0] == "namespaces"
        and (group, segments[2]) in kinds
        and kinds[(group, segments[2])].namespaced
    ):
        namespace, rest = segments[1], segments[2:]
        if _bad_segment(namespace):
            raise path_not_found()
    if not rest or len(rest) > 3 or any(_bad_segment(s) for s in rest):
        raise path_not_found()
    kind = kinds.get((group, rest[0]))
    if kind is None or version not in kind.versions:
        raise path_not_found()
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if sub and sub not in kind.subresources:
        raise path_not_found()
    if not kind.namespaced:
        namespace = ""
    elif namespace is None and name:
        raise path_not_found()  # a named namespaced object needs its namespace in the path
    return Target(kind, version, namespace, name, sub)
