"""The pure decision engine, as one sans-I/O conversation: plan, then decide.

:meth:`Engine.plan` screens the request and says what to read (a :class:`Plan`) or settles it (a
:class:`Decision`); the caller reads the stored object and the patch preview, then
:meth:`Engine.decide` gives the one Decision. No I/O, no clock, no logging: the proxy,
``dra-gatekeeper test`` and ``audit check`` drive exactly this pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gatekeeper.codec.jsonpath import get_field
from gatekeeper.codec.selectors import FieldRequirement, format_field_selector, parse_field_selector
from gatekeeper.policy.claims import AllocationScope, decide_allocated, request_refusal
from gatekeeper.policy.decision import Decision, allow, answered, deny, forbid, not_found
from gatekeeper.policy.encoded import decide_encoded, unaccepted_encoding
from gatekeeper.policy.integrity import (
    body_shape,
    checked_delete_options,
    patch_result,
    pin_delete,
    pinned_update,
)
from gatekeeper.policy.model import (
    Field,
    KindRule,
    KindSpec,
    ListSelectorMode,
    Policy,
    Scope,
    VersionSpec,
)
from gatekeeper.policy.nodeselector import node_labels_with_hostname
from gatekeeper.policy.ownership import (
    collection_pool_violation,
    fill_missing,
    ownership_violation,
)
from gatekeeper.policy.ownnode import decide_own_node
from gatekeeper.policy.patching import APPLY
from gatekeeper.policy.plan import Plan, Preview
from gatekeeper.request.encoded import EncodedBody
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.status import status_body
from gatekeeper.types import Identity, KubeObject

__all__ = ["ANSWERED_FROM_READ", "METHOD_NOT_ALLOWED", "Engine"]

METHOD_NOT_ALLOWED = "the server does not allow this method on the requested resource"
"""The apiserver's 405 message (recording 199: POST to a named path)."""
ANSWERED_FROM_READ = "stored object belongs to the driver on this node; answered from that read"
"""The reason of a plain-JSON get answered with the object the decision was made on."""

_JSON = "application/json"
_COLLECTION_VERBS = frozenset({"list", "watch", "deletecollection"})
_OBJECT_VERBS = frozenset({"get", "update", "patch", "delete"})
_READ_METHODS = frozenset({"GET", "HEAD"})
_OPEN_PATHS = frozenset({"/api", "/api/v1", "/apis", "/version", "/openapi/v2", "/openapi/v3"})


@dataclass(frozen=True, slots=True)
class Engine:
    """Decisions for one node under one policy.

    ``node_labels`` are the node's labels as far as they are known (``kubernetes.io/hostname``
    defaults to the node name); node selectors of allocations are matched against them.
    """

    policy: Policy
    node_name: str
    node_labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def plan(
        self,
        identity: Identity,
        info: RequestInfo,
        media_type: str = _JSON,
        *,
        plain_json: bool = False,
    ) -> Plan | Decision:
        """The request-level rules, once: a final Decision when they settle the request (refused,
        or a non-resource path), else the :class:`Plan` of what to read before :meth:`decide`.

        Nothing is fetched for a request already refused on its own (DESIGN §4.3: a refused
        request never reaches the apiserver, not even as the gatekeeper's read).
        ``plain_json``: the driver accepts the plain JSON object the gatekeeper reads (not a
        Table, metadata-only or protobuf form), so a get may be answered from that read.
        """
        screened = self._screen(identity, info)
        if isinstance(screened, Decision):
            return screened
        kind, version = screened
        if unaccepted := unaccepted_encoding(kind, media_type):
            return unaccepted
        if kind.rule is KindRule.OWN_NODE:
            # The node's own object: decided on the request alone, nothing to read first.
            return decide_own_node(identity.driver, info, kind, self.node_name)
        scope = None
        if kind.rule is KindRule.ALLOCATED_TO_DRIVER:
            scope = self._scope(identity.driver, version)
        fetch = None
        if info.verb in _OBJECT_VERBS:
            fetch = info.path[: -(len(info.subresource) + 1)] if info.subresource else info.path
        return Plan(
            identity,
            info,
            media_type,
            kind,
            version,
            self.node_name,
            fetch,
            scope,
            answer_from_fetch=plain_json and _answerable_get(info),
        )

    def decide(
        self,
        plan: Plan,
        body: Any = None,
        current: KubeObject | None = None,
        proposed: Preview | None = None,
    ) -> Decision:
        """Decide a planned request.

        ``current`` is the object read at ``plan.fetch`` (None if absent); ``proposed`` the
        preview (:func:`~gatekeeper.policy.conversation.preview_of`) of a strategic-merge or
        apply patch, or of a body only the apiserver decodes, with the upstream's answer
        (without one, a patch's result is approximated by a merge patch).
        """
        if isinstance(body, EncodedBody):
            return decide_encoded(self.decide, plan, body, current, proposed)
        info, kind, version, driver = plan.info, plan.kind, plan.version, plan.driver
        media_type = plan.media_type
        if kind.rule is KindRule.ALLOCATED_TO_DRIVER:
            scope = self._scope(driver, version)
            return decide_allocated(
                scope, info, kind, body, current, media_type=media_type, proposed=proposed
            )
        if info.verb == "deletecollection" and body is not None:
            # The client's DeleteOptions (dry run, preconditions, propagation) go upstream as
            # sent, once known to be DeleteOptions (recordings 163-166).
            options = checked_delete_options(info, kind, body)
            if isinstance(options, Decision):
                return options
            pinned = self._pin_selector(driver, info, kind, version)
            return replace(pinned, body=options) if pinned.forwards else pinned
        if info.verb in _COLLECTION_VERBS:
            return self._pin_selector(driver, info, kind, version)
        if info.verb == "create":
            return self._write(driver, info, kind, version, body, current=None)
        if current is None and info.verb == "patch" and media_type == APPLY:
            return self._apply_create(driver, info, kind, version, body)
        if current is None:
            return not_found(info, kind.qualified)
        return self._decide_stored(plan, body, current, proposed)

    def _decide_stored(
        self, plan: Plan, body: Any, current: KubeObject, proposed: Preview | None
    ) -> Decision:
        """A request on a stored object: the caller's on this node, then its verb's rule."""
        info, kind, version, driver = plan.info, plan.kind, plan.version, plan.driver
        if problem := ownership_violation(version, current, driver, self.node_name, stored=True):
            return forbid(driver, info, problem)
        if info.verb == "get" and plan.answer_from_fetch:
            # The object checked is the answer: a second read could return another object
            # (deleted and re-created by someone else in between) unchecked.
            return answered(ANSWERED_FROM_READ, 200, current)
        if info.verb == "get":
            return allow("stored object belongs to the driver on this node", info)
        if info.verb == "update":
            return self._write(driver, info, kind, version, body, current=current)
        if info.verb == "delete":
            return pin_delete(info, kind, body, current)
        if info.verb == "patch":
            return self._patch(plan, body, current, proposed)
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
        # The parser lets a trailing "/" through on discovery paths only (/apis/<g>/): the same
        # document as without it.
        path = path.removesuffix("/") if path != "/" else path
        if path in _OPEN_PATHS:
            return True
        parts = path.split("/")[1:]
        if parts[:2] == ["openapi", "v3"] and len(parts) == 5 and parts[2] == "apis":
            return parts[3] in self.policy.groups
        if parts[:3] == ["openapi", "v3", "api"] and len(parts) == 4:
            # The core group's document (kubectl explain nodes reads it; without it explain
            # fails), open when the policy has a core kind at that version.
            return any(
                kind.group == "" and parts[3] in kind.versions
                for kind in self.policy.kinds.values()
            )
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
        if kind.rule is KindRule.ALLOCATED_TO_DRIVER and (why := request_refusal(info)):
            return forbid(driver, info, why)
        if info.verb == "create" and info.name and not info.subresource:
            # A POST to a named path: the apiserver routes no create there (recording 199).
            refusal = deny(405, f"{info.method} to a named {kind.qualified} path")
            status = {**status_body(405, METHOD_NOT_ALLOWED), "details": {}, "code": 405}
            return replace(refusal, message=METHOD_NOT_ALLOWED, response=status)
        return None

    def _scope(self, driver: str, version: VersionSpec) -> AllocationScope:
        assert version.allocation is not None  # the loader sets it for this rule
        labels = node_labels_with_hostname(self.node_name, self.node_labels)
        return AllocationScope(version.allocation, driver, self.node_name, labels)

    def _pin_selector(
        self, driver: str, info: RequestInfo, kind: KindSpec, version: VersionSpec
    ) -> Decision:
        try:
            terms = parse_field_selector(info.query_value("fieldSelector") or "")
        except ValueError as exc:
            return deny(400, f"invalid fieldSelector: {exc}")
        if info.verb == "deletecollection" and (
            problem := collection_pool_violation(version, terms, self.node_name)
        ):
            return forbid(driver, info, problem)
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
        self, plan: Plan, patch: Any, current: KubeObject, proposed: Preview | None
    ) -> Decision:
        info, kind, driver = plan.info, plan.kind, plan.driver
        prepared = patch_result(info, kind, patch, current, plan.media_type, proposed)
        if isinstance(prepared, Decision):
            return prepared
        result, pinned = prepared
        if problem := ownership_violation(plan.version, result, driver, self.node_name):
            return forbid(driver, info, f"after the patch, {problem}")
        return allow(
            "patched object belongs to the driver on this node", info, pinned, plan.media_type
        )

    def _apply_create(
        self, driver: str, info: RequestInfo, kind: KindSpec, version: VersionSpec, body: Any
    ) -> Decision:
        # SECURITY: DESIGN §4.4 — the apiserver ignores a resourceVersion precondition when an
        # apply creates, so an apply could land on an object created after our check. Forwarding
        # it as a create (POST) makes that race fail with 409 AlreadyExists instead.
        decision = self._write(driver, info, kind, version, body, current=None)
        if not decision.allowed:
            return decision
        if version.owner_fields_immutable:
            # ... unless the apiserver itself refuses to change driver, node and pool of an
            # existing object (policy ``immutable``; recordings 171-173): then an apply landing
            # on an object created in between fails there (409 conflict or 422 immutable), and
            # forwarding the apply keeps its field ownership (Apply, not Update), so the next
            # apply with changed values succeeds, as it would without the gatekeeper.
            return allow(
                "applied object is created for the driver on this node",
                info,
                decision.body,
                APPLY,
            )
        target = info.as_create()
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
        if refusal := body_shape(info, kind, body):
            return refusal
        assert body is not None
        body = fill_missing(kind, version, body, driver, self.node_name)
        name = get_field(body, ("metadata", "name")) or None
        if problem := ownership_violation(version, body, driver, self.node_name):
            return forbid(driver, info, problem, name=name if isinstance(name, str) else None)
        if current is not None:
            pinned = pinned_update(info, kind, body, current)
            if isinstance(pinned, Decision):
                return pinned
            body = pinned
        return allow("object belongs to the driver on this node", info, body)


_ANSWERABLE_QUERY = frozenset({"resourceVersion"})


def _answerable_get(info: RequestInfo) -> bool:
    """Whether the gatekeeper's read (the latest object, no query) is the answer to this get:
    no query, or only ``resourceVersion`` "" or "0" (any version will do)."""
    return info.verb == "get" and all(
        key in _ANSWERABLE_QUERY and value in ("", "0") for key, value in info.query
    )
