"""Discovery and OpenAPI documents of the embedded API server, built from its served kinds.

Enough for kubectl: legacy and aggregated (``apidiscovery.k8s.io/v2``) discovery, and minimal
OpenAPI v2/v3 documents whose schemas accept any fields and whose PATCH operations list the
``fieldValidation`` parameter (so kubectl validates server-side, which this server accepts
without checking: a deliberate difference). ``/api/v1`` lists common core resources that
are not served, so that kubectl resolves their names; requests to them get 404.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Final

from gatekeeper.apiserver._kinds import ServedKind, sort_versions

__all__ = [
    "VERSION_INFO",
    "aggregated_discovery",
    "api_group",
    "api_group_list",
    "api_resource_list",
    "api_versions",
    "openapi_v2",
    "openapi_v3_document",
    "openapi_v3_index",
]

VERSION_INFO: Final[dict[str, str]] = {
    "major": "1",
    "minor": "36",
    "emulationMajor": "1",
    "emulationMinor": "36",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "35",
    "gitVersion": "v1.36.2-dra-gatekeeper-embedded",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-12-02T00:00:00Z",
    "goVersion": "go1.27.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}

_VERBS: Final = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
_SUB_VERBS: Final = ["get", "patch", "update"]
# A CRD's resource lists its verbs in the apiextensions apiserver's order.
_CUSTOM_VERBS: Final = [
    *("delete", "deletecollection", "get", "list", "patch", "create", "update", "watch")
]


def _verbs(kind: ServedKind) -> list[str]:
    return list(_CUSTOM_VERBS if kind.custom else _VERBS)


_CORE_STATIC: Final = tuple(
    ServedKind("", resource, kind, namespaced, ("v1",), short_names=short)
    for resource, kind, namespaced, short in (
        ("configmaps", "ConfigMap", True, ("cm",)),
        ("endpoints", "Endpoints", True, ("ep",)),
        ("events", "Event", True, ("ev",)),
        ("namespaces", "Namespace", False, ("ns",)),
        ("nodes", "Node", False, ("no",)),
        ("persistentvolumeclaims", "PersistentVolumeClaim", True, ("pvc",)),
        ("persistentvolumes", "PersistentVolume", False, ("pv",)),
        ("pods", "Pod", True, ("po",)),
        ("secrets", "Secret", True, ()),
        ("serviceaccounts", "ServiceAccount", True, ("sa",)),
        ("services", "Service", True, ("svc",)),
    )
)


def _kinds_at(kinds: Sequence[ServedKind], group: str, version: str) -> list[ServedKind]:
    found = {k.resource: k for k in kinds if k.group == group and version in k.versions}
    if group == "" and version == "v1":
        for static in _CORE_STATIC:
            found.setdefault(static.resource, static)
    return [found[name] for name in sorted(found)]


def _group_versions(kinds: Sequence[ServedKind], group: str) -> list[str]:
    return sort_versions([v for k in kinds if k.group == group for v in k.versions])


def _groups(kinds: Sequence[ServedKind]) -> list[str]:
    # The apiserver lists its built-in groups first, then those of custom resources.
    custom = {k.group for k in kinds if k.custom}
    return sorted({k.group for k in kinds if k.group}, key=lambda g: (g in custom, g))


def api_versions(server_address: str) -> dict[str, Any]:
    """``GET /api``: the legacy core group's versions."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _group_doc(kinds: Sequence[ServedKind], group: str) -> dict[str, Any]:
    versions = [
        {"groupVersion": f"{group}/{v}", "version": v} for v in _group_versions(kinds, group)
    ]
    return {"name": group, "versions": versions, "preferredVersion": versions[0]}


def api_group_list(kinds: Sequence[ServedKind]) -> dict[str, Any]:
    """``GET /apis`` (legacy): an ``APIGroupList``."""
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group_doc(kinds, g) for g in _groups(kinds)],
    }


def api_group(kinds: Sequence[ServedKind], group: str) -> dict[str, Any] | None:
    """``GET /apis/<group>``, or None if the group is not served."""
    if group not in _groups(kinds):
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_doc(kinds, group)}


def api_resource_list(
    kinds: Sequence[ServedKind], group: str, version: str
) -> dict[str, Any] | None:
    """``GET /apis/<group>/<version>`` or ``/api/v1``, or None if nothing is served there."""
    served = _kinds_at(kinds, group, version)
    if not served:
        return None
    resources: list[dict[str, Any]] = []
    for kind in served:
        entry: dict[str, Any] = {
            "name": kind.resource,
            "singularName": kind.singular_name,
            "namespaced": kind.namespaced,
            "kind": kind.kind,
            "verbs": _verbs(kind),
        }
        if kind.short_names:
            entry["shortNames"] = list(kind.short_names)
        entry["storageVersionHash"] = kind.storage_version_hash
        resources.append(entry)
        resources += [
            {
                "name": f"{kind.resource}/{sub}",
                "singularName": "",
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": list(_SUB_VERBS),
            }
            for sub in kind.subresources
        ]
    group_version = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _discovery_resource(kind: ServedKind, version: str) -> dict[str, Any]:
    # A built-in resource leaves group and version to its group-version; a CRD's names them.
    group, version = (kind.group, version) if kind.custom else ("", "")
    response_kind = {"group": group, "version": version, "kind": kind.kind}
    entry: dict[str, Any] = {
        "resource": kind.resource,
        "responseKind": response_kind,
        "scope": "Namespaced" if kind.namespaced else "Cluster",
        "singularResource": kind.singular_name,
        "verbs": _verbs(kind),
    }
    if kind.short_names:
        entry["shortNames"] = list(kind.short_names)
    if kind.subresources:
        entry["subresources"] = [
            {"subresource": sub, "responseKind": response_kind, "verbs": list(_SUB_VERBS)}
            for sub in kind.subresources
        ]
    return entry


def aggregated_discovery(
    kinds: Sequence[ServedKind], *, core: bool, version: str
) -> dict[str, Any]:
    """``GET /api`` or ``/apis`` with aggregated discovery (``APIGroupDiscoveryList``)."""
    groups = [""] if core else _groups(kinds)
    items = []
    for group in groups:
        versions = ["v1"] if core else _group_versions(kinds, group)
        items.append(
            {
                "metadata": {"name": group} if group else {},
                "versions": [
                    {
                        "version": v,
                        "resources": [
                            _discovery_resource(k, v) for k in _kinds_at(kinds, group, v)
                        ],
                        "freshness": "Current",
                    }
                    for v in versions
                ],
            }
        )
    return {
        "kind": "APIGroupDiscoveryList",
        "apiVersion": f"apidiscovery.k8s.io/{version}",
        "metadata": {},
        "items": items,
    }


def _schema_name(kind: ServedKind, version: str) -> str:
    group = ".".join(reversed(kind.group.split("."))) if kind.group else "io.k8s.api.core"
    return f"{group}.{version}.{kind.kind}"


def _schema(kind: ServedKind, version: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"{kind.kind} (embedded API server: any fields are accepted)",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
        "x-kubernetes-preserve-unknown-fields": True,
        "x-kubernetes-group-version-kind": [
            {"group": kind.group, "version": version, "kind": kind.kind}
        ],
    }


_QUERY = ("dryRun", "fieldManager", "fieldValidation", "force", "pretty")


def _operation(kind: ServedKind, version: str, action: str, ref: str) -> dict[str, Any]:
    params = [
        {"name": n, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
        for n in _QUERY
    ]
    return {
        "operationId": f"{action}{kind.kind}",
        "parameters": params,
        "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": ref}}}}
        },
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {
            "group": kind.group,
            "version": version,
            "kind": kind.kind,
        },
    }


def _paths(kind: ServedKind, version: str, ref: str) -> dict[str, Any]:
    root = f"/apis/{kind.group}/{version}" if kind.group else "/api/v1"
    scope = "/namespaces/{namespace}" if kind.namespaced else ""
    collection = f"{root}{scope}/{kind.resource}"
    ops = {a: _operation(kind, version, a, ref) for a in ("get", "put", "patch", "delete")}
    item = {verb: ops[verb] for verb in ("get", "put", "patch", "delete")}
    return {
        collection: {
            "get": _operation(kind, version, "list", ref),
            "post": _operation(kind, version, "post", ref),
        },
        collection + "/{name}": item,
    }


def openapi_v3_document(
    kinds: Sequence[ServedKind], group: str, version: str
) -> dict[str, Any] | None:
    """``GET /openapi/v3/apis/<group>/<version>`` (or ``api/v1``), or None."""
    served = [k for k in kinds if k.group == group and version in k.versions]
    if not served:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for kind in served:
        name = _schema_name(kind, version)
        schemas[name] = _schema(kind, version)
        paths.update(_paths(kind, version, f"#/components/schemas/{name}"))
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.36.2"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _digest(doc: Any) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest().upper()


def openapi_v3_index(kinds: Sequence[ServedKind]) -> dict[str, Any]:
    """``GET /openapi/v3``: where each served group/version's document is."""
    paths: dict[str, Any] = {}
    pairs = sorted({(k.group, v) for k in kinds for v in k.versions})
    for group, version in pairs:
        rel = f"apis/{group}/{version}" if group else "api/v1"
        doc = openapi_v3_document(kinds, group, version)
        paths[rel] = {"serverRelativeURL": f"/openapi/v3/{rel}?hash={_digest(doc)}"}
    return {"paths": paths}


def openapi_v2(kinds: Sequence[ServedKind]) -> dict[str, Any]:
    """``GET /openapi/v2``: a Swagger 2.0 document with a permissive schema per kind."""
    definitions = {}
    for kind in kinds:
        for version in kind.versions:
            definitions[_schema_name(kind, version)] = _schema(kind, version)
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.36.2"},
        "paths": {},
        "definitions": definitions,
    }
