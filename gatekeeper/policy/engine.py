"""The pure decision engine: (identity, request, body, stored object) → Decision.

No I/O, no clock, no logging: the proxy, ``dra-gatekeeper test`` and ``audit check`` run the
same code. The proxy asks :meth:`Engine.lookup` what to fetch, then calls :meth:`Engine.decide`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from gatekeeper.identity import Identity
from gatekeeper.jsonpath import get_field
from gatekeeper.policy.decision import Decision, allow, deny, forbid
from gatekeeper.policy.model import Field, KindSpec, ListSelectorMode, Policy, Scope, VersionSpec
from gatekeeper.policy.ownership import fill_missing, ownership_violation
from gatekeeper.policy.patching import (
    APPLY,
    STRATEGIC_MERGE,
    PatchError,
    patched_object,
    pin_patch,
)
from gatekeeper.requestinfo import RequestInfo, parse_request
from gatekeeper.selectors import FieldRequirement, format_field_selector, parse_field_selector
from gatekeeper.types import KubeObject

__all__ = ["Engine"]

JSON = "application/json"
_CREATE_QUERY = frozenset({"fieldManager", "fieldValidation", "dryRun", "pretty"})
_PREVIEWED = frozenset({STRATEGIC_MERGE, APPLY})
_COLLECTION_VERBS = frozenset({"list", "watch", "deletecollection"})
_OBJECT_VERBS = frozenset({"get", "update", "patch", "delete"})
_READ_METHODS = frozenset({"GET", "HEAD"})
_OPEN_PATHS = frozenset({"/api", "/api/v1", "/apis", "/version", "/openapi/v2", "/openapi/v3"})


@dataclass(frozen=True, slots=True)
class Engine:
    """Decisions for one node under one policy."""

    policy: Policy
    node_name: str

    def lookup(self, identity: Identity, info: RequestInfo) -> str | None:
        """The path of the stored object to fetch before deciding, or None.

        Nothing is fetched for a request already refused on its own (DESIGN §4.3: a refused
        request never reaches the apiserver, not even as the gatekeeper's read).
        """
        if info.verb not in _OBJECT_VERBS or not isinstance(self._screen(identity, info), tuple):
            return None
        if info.subresource:
            return info.path[: -(len(info.subresource) + 1)]
        return info.path

    def needs_preview(
        self, identity: Identity, info: RequestInfo, current: KubeObject | None, media_type: str
    ) -> bool:
        """Whether to ask the upstream (``dryRun=All``) what a patch would store: only for
        strategic-merge and apply patches of a stored object the caller may touch."""
        if info.verb != "patch" or media_type not in _PREVIEWED or current is None:
            return False
        screened = self._screen(identity, info)
        if isinstance(screened, Decision):
            return False
        _, version = screened
        driver = identity.driver
        return ownership_violation(version, current, driver, self.node_name, stored=True) is None

    def decide(
        self,
        identity: Identity,
        info: RequestInfo,
        body: Any = None,
        current: KubeObject | None = None,
        *,
        media_type: str = JSON,
        proposed: KubeObject | None = None,
    ) -> Decision:
        """Decide one request.

        ``current`` is what :meth:`lookup` fetched (None if absent); ``media_type`` the body's
        content type; ``proposed`` the upstream's ``dryRun=All`` result of a strategic-merge or
        apply patch (computed here when absent).
        """
        screened = self._screen(identity, info)
        if isinstance(screened, Decision):
            return screened
        kind, version = screened
        driver = identity.driver
        if info.verb in _COLLECTION_VERBS:
            return self._pin_selector(driver, info, kind, version)
        if info.verb == "create":
            return self._write(driver, info, kind, version, body, current=None)
        if current is None and info.verb == "patch" and media_type == APPLY:
            return self._apply_create(driver, info, kind, version, body)
        if current is None:
            return _not_found(info, kind)
        if problem := ownership_violation(version, current, driver, self.node_name, stored=True):
            return forbid(driver, info, problem)
        if info.verb == "get":
            return allow("stored object belongs to the driver on this node", info)
        if info.verb == "update":
            return self._write(driver, info, kind, version, body, current=current)
        if info.verb == "delete":
            return _pin_delete(info, kind, body, current)
        if info.verb == "patch":
            return self._patch(driver, info, kind, version, body, current, media_type, proposed)
        return forbid(
            driver, info, f"{info.verb} is not supported by the gatekeeper for {kind.qualified}"
        )

    def _screen(
        self, identity: Identity, info: RequestInfo
    ) -> Decision | tuple[KindSpec, VersionSpec]:
        """Request-level rules: the caller, the kind, the version, the path's shape.

        A Decision when they settle the request (refused, or a non-resource path); else the
        kind and version whose object rules apply.
        """
        driver = identity.driver
        if not self.policy.allows_driver(driver):
            return forbid(
                driver, info, f'driver "{driver}" is not allowed on node "{self.node_name}"'
            )
        if not info.is_resource_request:
            return self._non_resource(driver, info)
        kind = self.policy.kind_for(info.api_group, info.resource)
        if kind is None:
            return forbid(driver, info, "the gatekeeper policy does not allow this resource")
        version = kind.versions.get(info.api_version)
        if version is None:
            return forbid(
                driver, info, f"version {info.api_version} of {kind.qualified} is not in the policy"
            )
        return self._shape(driver, info, kind) or (kind, version)

    def _non_resource(self, driver: str, info: RequestInfo) -> Decision:
        if info.method in _READ_METHODS and self._open_path(info.path):
            return allow("discovery and version paths are open to drivers", info)
        return forbid(driver, info, "only discovery of the policy's API groups is allowed")

    def _open_path(self, path: str) -> bool:
        if path in _OPEN_PATHS:
            return True
        parts = path.split("/")[1:]
        if parts[:2] == ["openapi", "v3"] and len(parts) == 5 and parts[2] == "apis":
            return parts[3] in self.policy.groups
        return parts[0] == "apis" and len(parts) in (2, 3) and parts[1] in self.policy.groups

    def _shape(self, driver: str, info: RequestInfo, kind: KindSpec) -> Decision | None:
        namespaced = kind.scope is Scope.NAMESPACED
        if info.namespace and not namespaced:
            return deny(
                400, f"{kind.qualified} is cluster-scoped: the path must not name a namespace"
            )
        if namespaced and not info.namespace and info.verb not in ("list", "watch"):
            return deny(400, f"{kind.qualified} is namespaced: the path must name a namespace")
        if info.subresource and info.subresource not in kind.subresources:
            return forbid(driver, info, f'subresource "{info.subresource}" is not in the policy')
        if info.verb not in kind.verbs:
            return forbid(driver, info, f"verb {info.verb} is not allowed on {kind.qualified}")
        return None

    def _pin_selector(
        self, driver: str, info: RequestInfo, kind: KindSpec, version: VersionSpec
    ) -> Decision:
        try:
            terms = parse_field_selector(info.query_value("fieldSelector") or "")
        except ValueError as exc:
            return deny(400, f"invalid fieldSelector: {exc}")
        wanted = {
            version.selectors[Field.DRIVER]: driver,
            version.selectors[Field.NODE]: self.node_name,
        }
        missing: list[FieldRequirement] = []
        for key, want in wanted.items():
            pinned = [t.value for t in terms if t.field == key and t.operator == "="]
            if any(value != want for value in pinned):
                other = next(value for value in pinned if value != want)
                return forbid(driver, info, f'fieldSelector pins {key}="{other}", not "{want}"')
            if not pinned:
                missing.append(FieldRequirement(key, "=", want))
        if not missing:
            return allow("field selector pins the driver and this node", info)
        if kind.list_selector is ListSelectorMode.INJECT:
            selector = format_field_selector((*terms, *missing))
            return allow(
                "pinning field selector terms injected", info.with_query("fieldSelector", selector)
            )
        needed = ",".join(f"{key}={want}" for key, want in wanted.items())
        return forbid(
            driver,
            info,
            f"{info.verb} requires fieldSelector {needed} "
            f"(missing {format_field_selector(missing)})",
        )

    def _patch(
        self,
        driver: str,
        info: RequestInfo,
        kind: KindSpec,
        version: VersionSpec,
        patch: Any,
        current: KubeObject,
        media_type: str,
        proposed: KubeObject | None,
    ) -> Decision:
        stored_rv = str(current.get("metadata", {}).get("resourceVersion", ""))
        if conflict := _stale(info, kind, _patch_resource_version(patch), stored_rv):
            return conflict
        try:
            result = proposed or patched_object(media_type, current, patch)
            pinned = pin_patch(media_type, patch, stored_rv)
        except PatchError as exc:
            return deny(422, str(exc), f'{kind.qualified} "{info.name}" is invalid: {exc}')
        if refusal := _body_shape(info, kind, result):
            return refusal
        if problem := ownership_violation(version, result, driver, self.node_name):
            return forbid(driver, info, f"after the patch, {problem}")
        return allow("patched object belongs to the driver on this node", info, pinned, media_type)

    def _apply_create(
        self, driver: str, info: RequestInfo, kind: KindSpec, version: VersionSpec, body: Any
    ) -> Decision:
        # SECURITY: DESIGN §4.4 — the apiserver ignores a resourceVersion precondition when an
        # apply creates, so an apply could land on an object created after our check. Forwarding
        # it as a create (POST) makes that race fail with 409 AlreadyExists instead.
        decision = self._write(driver, info, kind, version, body, current=None)
        if not decision.allowed:
            return decision
        collection = info.path.rsplit("/", 1)[0]
        query = [(k, v) for k, v in info.query if k in _CREATE_QUERY]
        target = parse_request("POST", collection + ("?" + urlencode(query) if query else ""))
        return allow("applied object is created for the driver on this node", target, decision.body)

    def _write(
        self,
        driver: str,
        info: RequestInfo,
        kind: KindSpec,
        version: VersionSpec,
        body: KubeObject | None,
        *,
        current: KubeObject | None,
    ) -> Decision:
        if refusal := _body_shape(info, kind, body):
            return refusal
        assert body is not None
        body = fill_missing(kind, version, body, driver, self.node_name)
        name = get_field(body, ("metadata", "name")) or None
        if problem := ownership_violation(version, body, driver, self.node_name):
            return forbid(driver, info, problem, name=name if isinstance(name, str) else None)
        if current is not None:
            stored_rv = str(current.get("metadata", {}).get("resourceVersion", ""))
            asked = get_field(body, ("metadata", "resourceVersion"))
            if conflict := _stale(info, kind, asked if isinstance(asked, str) else "", stored_rv):
                return conflict
            body = _pin_resource_version(body, stored_rv)
        return allow("object belongs to the driver on this node", info, body)


def _body_shape(info: RequestInfo, kind: KindSpec, body: KubeObject | None) -> Decision | None:
    if not isinstance(body, dict):
        return deny(400, f"{info.verb} of {kind.qualified} needs a JSON object body")
    expected = f"{kind.group}/{info.api_version}" if kind.group else info.api_version
    if body.get("apiVersion") != expected or body.get("kind") != kind.kind:
        return deny(
            400,
            f'body apiVersion/kind "{body.get("apiVersion")}"/"{body.get("kind")}" does not match '
            f'the URL ("{expected}"/"{kind.kind}")',
        )
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        return deny(400, "metadata must be an object")
    metadata = metadata or {}
    namespace = metadata.get("namespace")
    if namespace and namespace != info.namespace:
        return deny(
            400,
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    if info.name and metadata.get("name") != info.name:
        return deny(
            400,
            f"the name of the object ({metadata.get('name')}) does not match the name on the URL "
            f"({info.name})",
        )
    return None


def _pin_resource_version(body: KubeObject, resource_version: str) -> KubeObject:
    # SECURITY: DESIGN §4.4 — the check ran against the stored object; pinning its
    # resourceVersion makes a concurrent change fail with 409 instead of slipping past the check.
    if get_field(body, ("metadata", "resourceVersion")) == resource_version:
        return body
    pinned = copy.deepcopy(body)
    pinned.setdefault("metadata", {})["resourceVersion"] = resource_version
    return pinned


def _patch_resource_version(patch: Any) -> str:
    if isinstance(patch, dict) and isinstance(patch.get("metadata"), dict):
        value = patch["metadata"].get("resourceVersion")
        return value if isinstance(value, str) else ""
    return ""


def _stale(info: RequestInfo, kind: KindSpec, asked: str, stored: str) -> Decision | None:
    """409 when the client's resourceVersion is not the one the decision was made on.

    Forwarding it would let the write land on a version the gatekeeper never checked.
    """
    if not asked or asked == stored:
        return None
    return deny(
        409,
        "resourceVersion does not match the stored object",
        f'Operation cannot be fulfilled on {kind.qualified} "{info.name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        group=kind.group,
        kind=kind.resource,
        name=info.name,
    )


def _pin_delete(
    info: RequestInfo, kind: KindSpec, body: KubeObject | None, current: KubeObject
) -> Decision:
    meta = current.get("metadata", {})
    options = copy.deepcopy(body) if isinstance(body, dict) else {}
    options.setdefault("kind", "DeleteOptions")
    options.setdefault("apiVersion", "v1")
    preconditions = options.get("preconditions") or {}
    if not isinstance(preconditions, dict):
        return deny(400, "DeleteOptions.preconditions must be an object")
    for key, stored in (("uid", meta.get("uid")), ("resourceVersion", meta.get("resourceVersion"))):
        asked = preconditions.get(key)
        if asked not in (None, "") and asked != stored:
            label = "UID" if key == "uid" else "ResourceVersion"
            return deny(
                409,
                "delete precondition does not match the stored object",
                f'Operation cannot be fulfilled on {kind.qualified} "{info.name}": Precondition '
                f"failed: {label} in precondition: {asked}, {label} in object meta: {stored}",
            )
        preconditions[key] = stored
    options["preconditions"] = preconditions
    # SECURITY: DESIGN §4.4 — the delete lands only on the object that was checked.
    return allow("stored object belongs to the driver on this node", info, options)


def _not_found(info: RequestInfo, kind: KindSpec) -> Decision:
    return deny(
        404,
        "object not found",
        f'{kind.qualified} "{info.name}" not found',
        group=kind.group,
        kind=kind.resource,
        name=info.name,
    )
