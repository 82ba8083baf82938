"""What the embedded API server serves: kinds, their versions, selectable and immutable fields."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gatekeeper.apiserver._jsonpath import MISSING, get_field, parse_field_path
from gatekeeper.apiserver._types import KubeObject

__all__ = ["ServedKind", "field_values", "qualified_kind", "qualified_resource", "sort_versions"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})

# Facts of built-in types that no policy states: their registry strategies set no
# metadata.generation, and a Go struct (not a pointer) status is always written, "status": {}
# when empty (the differential run against a real 1.36 apiserver, recordings 110 and 197).
_WITHOUT_GENERATION = frozenset({("resource.k8s.io", "resourceclaims"), ("", "nodes")})
_STATUS_ALWAYS = frozenset({("resource.k8s.io", "resourceclaims")})


@dataclass(frozen=True, slots=True)
class ServedKind:
    """One kind the embedded API server serves, stored once per group/resource.

    ``selectable_fields`` maps a version to ``{field-selector key: dotted JSON path}``;
    ``metadata.name`` (and ``metadata.namespace`` for namespaced kinds) always work.
    ``immutable_fields`` maps a version to dotted paths an update or patch may not change.
    ``custom`` marks a custom resource (a CRD's kind): a real apiserver reads its bodies as
    JSON or YAML only, never protobuf, and says so in its 415. ``storage_version`` is the
    version objects are stored at (discovery's ``storageVersionHash``): the preferred one unless
    set (a DeviceTaintRule is stored at v1alpha3 while v1beta2 is served).
    """

    group: str
    resource: str
    kind: str
    namespaced: bool
    versions: tuple[str, ...]
    selectable_fields: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: _EMPTY)
    immutable_fields: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _EMPTY)
    subresources: tuple[str, ...] = ()
    singular: str = ""
    short_names: tuple[str, ...] = ()
    custom: bool = False
    storage_version: str = ""

    def __post_init__(self) -> None:
        if not self.versions:
            raise ValueError(f"{self.resource}: at least one served version is required")
        if not self.resource or self.resource != self.resource.lower() or "/" in self.resource:
            raise ValueError(f"bad resource name {self.resource!r}: lower-case plural expected")
        for table in (self.selectable_fields, self.immutable_fields):
            for version in table:
                if version not in self.versions:
                    raise ValueError(f"{self.resource}: version {version!r} is not served")
        for fields in self.selectable_fields.values():
            for path in fields.values():
                parse_field_path(path)
        for paths in self.immutable_fields.values():
            for path in paths:
                parse_field_path(path)

    @property
    def singular_name(self) -> str:
        """The singular resource name for discovery (``kind.lower()`` unless set)."""
        return self.singular or self.kind.lower()

    @property
    def sets_generation(self) -> bool:
        """Whether the apiserver keeps ``metadata.generation`` for this kind."""
        return self.custom or (self.group, self.resource) not in _WITHOUT_GENERATION

    @property
    def status_always(self) -> bool:
        """Whether an object of this kind always carries ``status`` (``{}`` when empty)."""
        return not self.custom and (self.group, self.resource) in _STATUS_ALWAYS

    @property
    def storage_version_hash(self) -> str:
        """The apiserver's ``storageVersionHash``: the first 8 bytes of the SHA-256 of
        ``group/version/Kind`` at the storage version, base64 (k8s.io/apiserver discovery)."""
        version = self.storage_version or self.versions[0]
        gvk = f"{self.group}/{version}/{self.kind}" if self.group else f"{version}/{self.kind}"
        return base64.b64encode(hashlib.sha256(gvk.encode()).digest()[:8]).decode()

    def group_version(self, version: str) -> str:
        """``apiVersion`` for ``version``: ``group/version``, or just ``version`` for core."""
        return f"{self.group}/{version}" if self.group else version

    def field_paths(self, version: str) -> dict[str, str]:
        """Every field-selector key accepted at ``version`` → its dotted JSON path."""
        paths = {"metadata.name": "metadata.name"}
        if self.namespaced or not self.selectable_fields.get(version):
            # The apiserver's default conversion accepts metadata.namespace for every kind
            # without its own field-label conversion (cluster-scoped ones have it empty).
            paths["metadata.namespace"] = "metadata.namespace"
        paths.update(self.selectable_fields.get(version, {}))
        return paths

    def unsupported_field_message(self, version: str, label: str) -> str:
        """The apiserver's 400 message for a field selector key it does not support."""
        if self.selectable_fields.get(version):
            return (
                f"field label not supported for {self.group_version(version)}, "
                f"Kind={self.kind}: {label}"
            )
        return (
            f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"'
        )


def _as_selector_string(value: Any) -> str:
    if value is MISSING or value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def field_values(kind: ServedKind, version: str, obj: KubeObject) -> dict[str, str]:
    """The values the field-selector keys of ``kind`` at ``version`` take on ``obj``."""
    return {
        key: _as_selector_string(get_field(obj, parse_field_path(path)))
        for key, path in kind.field_paths(version).items()
    }


def qualified_resource(kind: ServedKind) -> str:
    """``resourceslices.resource.k8s.io``, or ``nodes`` for the core group (as in messages)."""
    return f"{kind.resource}.{kind.group}" if kind.group else kind.resource


def qualified_kind(kind: ServedKind) -> str:
    """``ResourceSlice.resource.k8s.io``, or ``Node`` for the core group (as in messages)."""
    return f"{kind.kind}.{kind.group}" if kind.group else kind.kind


_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def _version_rank(version: str) -> tuple[int, int, int, str]:
    match = _VERSION_RE.match(version)
    if match is None:
        return (3, 0, 0, version)
    major, stage, minor = match.groups()
    stage_rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (stage_rank, -int(major), -int(minor or 0), version)


def sort_versions(versions: set[str] | list[str] | tuple[str, ...]) -> list[str]:
    """Kubernetes version priority: GA before beta before alpha, newer first."""
    return sorted(set(versions), key=_version_rank)
