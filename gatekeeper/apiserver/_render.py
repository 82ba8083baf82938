"""Objects as they leave the embedded API server: JSON, ``Table`` or ``PartialObjectMetadata``.

Tables carry the apiserver's printer columns for ResourceSlices and ResourceClaims
(recordings 29, 116); every other kind gets ``Name`` and ``Age`` (a deliberate difference:
the apiserver has per-kind printers, or ``Created At`` for kinds without one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from gatekeeper.apiserver._jsonpath import get_field
from gatekeeper.apiserver._kinds import ServedKind
from gatekeeper.apiserver._negotiate import PARTIAL, TABLE, Negotiated
from gatekeeper.apiserver._types import KubeObject

__all__ = ["human_duration", "render_list", "render_object", "versioned"]

_NAME_DOC = (
    "Name must be unique within a namespace. Is required when creating resources, although some "
    "resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
_AGE_DOC = (
    "CreationTimestamp is a timestamp representing the server time when this object was "
    "created. It is not guaranteed to be set in happens-before order across separate "
    "operations. Clients may not set this value. It is represented in RFC3339 form and is in "
    "UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)

Cell = Callable[[KubeObject], Any]


def _path(*keys: str) -> Cell:
    def cell(obj: KubeObject) -> Any:
        value = get_field(obj, keys)
        return value if isinstance(value, str) else ""

    return cell


def _claim_state(obj: KubeObject) -> str:
    status = obj.get("status") or {}
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        states = ["deleted"]
    elif status.get("allocation"):
        states = ["allocated"]
    else:
        states = ["pending"]
    if status.get("reservedFor"):
        states.append("reserved")
    return ",".join(states)


_EXTRA_COLUMNS: dict[tuple[str, str], Sequence[tuple[str, str, Cell]]] = {
    ("resource.k8s.io", "resourceslices"): (
        (
            "Node",
            "NodeName identifies the node which provides the resources in this pool. A field "
            "selector can be used to list only ResourceSlice objects belonging to a certain "
            "node.\n\nThis field can be used to limit access from nodes to ResourceSlices with "
            "the same node name. It also indicates to autoscalers that adding new nodes of the "
            "same type as some old node might also make new resources available.\n\nExactly "
            "one of NodeName, NodeSelector, AllNodes, and PerDeviceNodeSelection must be set. "
            "This field is immutable.",
            _path("spec", "nodeName"),
        ),
        (
            "Driver",
            "Driver identifies the DRA driver providing the capacity information. A field "
            "selector can be used to list only ResourceSlice objects with a certain driver "
            "name.\n\nMust be a DNS subdomain and should end with a DNS domain owned by the "
            "vendor of the driver. It should use only lower case characters. This field is "
            "immutable.",
            _path("spec", "driver"),
        ),
        (
            "Pool",
            "Name is used to identify the pool. For node-local devices, this is often the node "
            "name, but this is not required.\n\nIt must not be longer than 253 characters and "
            "must consist of one or more DNS sub-domains separated by slashes. This field is "
            "immutable.",
            _path("spec", "pool", "name"),
        ),
    ),
    ("resource.k8s.io", "resourceclaims"): (
        (
            "State",
            "A summary of the current state (allocated, pending, reserved, etc.).",
            _claim_state,
        ),
    ),
}


def human_duration(seconds: float) -> str:
    """Age as kubectl and the apiserver print it (``k8s.io/apimachinery/pkg/util/duration``)."""
    secs = int(seconds)
    if secs < -1:
        return "<invalid>"
    if secs < 0:
        return "0s"
    if secs < 120:
        return f"{secs}s"
    minutes, hours = secs // 60, secs // 3600
    if minutes < 10:
        return f"{minutes}m{secs % 60}s" if secs % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def _age(obj: KubeObject) -> str:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return "<unknown>"
    try:
        created = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    return human_duration((datetime.now(UTC) - created).total_seconds())


def versioned(kind: ServedKind, version: str, obj: KubeObject) -> KubeObject:
    """``obj`` with ``kind`` and ``apiVersion`` of ``version`` first (no field conversion)."""
    rest = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return {"kind": kind.kind, "apiVersion": kind.group_version(version), **rest}


def _partial(obj: KubeObject, meta_version: str) -> KubeObject:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": f"meta.k8s.io/{meta_version}",
        "metadata": obj.get("metadata") or {},
    }


def _table(
    kind: ServedKind, objs: Sequence[KubeObject], list_meta: KubeObject, meta_version: str
) -> KubeObject:
    extra = _EXTRA_COLUMNS.get((kind.group, kind.resource), ())
    columns = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": _NAME_DOC,
            "priority": 0,
        }
    ]
    columns += [
        {"name": name, "type": "string", "format": "", "description": doc, "priority": 0}
        for name, doc, _ in extra
    ]
    columns.append(
        {"name": "Age", "type": "string", "format": "", "description": _AGE_DOC, "priority": 0}
    )
    rows = [
        {
            "cells": [(obj.get("metadata") or {}).get("name", "")]
            + [cell(obj) for _, _, cell in extra]
            + [_age(obj)],
            "object": _partial(obj, meta_version),
        }
        for obj in objs
    ]
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{meta_version}",
        "metadata": list_meta,
        "columnDefinitions": columns,
        "rows": rows,
    }


def render_object(
    kind: ServedKind, version: str, obj: KubeObject, negotiated: Negotiated
) -> KubeObject:
    """One object (get, create, update, patch, delete, a watch event) as negotiated."""
    if negotiated.mode == TABLE:
        meta = {"resourceVersion": (obj.get("metadata") or {}).get("resourceVersion", "")}
        return _table(kind, [obj], meta, negotiated.meta_version)
    if negotiated.mode == PARTIAL:
        return _partial(obj, negotiated.meta_version)
    return versioned(kind, version, obj)


def render_list(
    kind: ServedKind,
    version: str,
    objs: Sequence[KubeObject],
    list_meta: KubeObject,
    negotiated: Negotiated,
) -> KubeObject:
    """A list; items of a plain list carry no ``kind``/``apiVersion``, as the apiserver's."""
    if negotiated.mode == TABLE:
        return _table(kind, objs, list_meta, negotiated.meta_version)
    if negotiated.mode == PARTIAL:
        return {
            "kind": "PartialObjectMetadataList",
            "apiVersion": f"meta.k8s.io/{negotiated.meta_version}",
            "metadata": list_meta,
            "items": [_partial(obj, negotiated.meta_version) for obj in objs],
        }
    if kind.custom:
        # A custom resource's list is unstructured JSON, whose list metadata always carries
        # "continue" (empty on the last page; recording 225).
        list_meta = {"continue": "", **list_meta}
    return {
        "kind": f"{kind.kind}List",
        "apiVersion": kind.group_version(version),
        "metadata": list_meta,
        "items": [
            {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in objs
        ],
    }
