"""The pure decision engine, as one sans-I/O conversation: screen, accept the body, decide.

:meth:`Engine.screen` applies the request-level rules once and says what to read (a
:class:`Plan`) or settles the request (a :class:`Decision`); :meth:`Engine.accept` checks the
body's encoding; the caller reads the stored object and the patch preview, then
:meth:`Engine.decide` gives the one Decision. No I/O, no clock, no logging: the proxy,
``dra-gatekeeper test`` and ``audit check`` drive exactly these calls
(:mod:`gatekeeper.policy.conversation`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gatekeeper.codec.jsonpath import get_field
from gatekeeper.codec.selectors import FieldRequirement, format_field_selector, parse_field_selector
from gatekeeper.policy.admission import CelContext
from gatekeeper.policy.changes import maintained_change
from gatekeeper.policy.claims import CONTINUE_REFUSED, AllocationScope, request_refusal
from gatekeeper.policy.decision import Decision, allow, deny, forbid
from gatekeeper.policy.encoded import encoded_decision, encoded_json, unaccepted_encoding
from gatekeeper.policy.integrity import checked_delete_options, requested_resource_version
from gatekeeper.policy.model import (
    Credentials,
    Field,
    KindRule,
    KindSpec,
    ListSelectorMode,
    Policy,
    Scope,
    VersionSpec,
)
from gatekeeper.policy.nodeselector import node_labels_with_hostname
from gatekeeper.policy.objects import ANSWERED_FROM_READ, decide_object
from gatekeeper.policy.owners import (
    CelOwner,
    NamespaceOwner,
    NodeLocalOwner,
    OnNodeOwner,
    OwnObjectOwner,
)
from gatekeeper.policy.ownership import collection_pool_violation
from gatekeeper.policy.plan import Ownership, Plan
from gatekeeper.policy.stored import Stored, holds_null, predict
from gatekeeper.request.encoded import EncodedBody
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.rule import Rule
from gatekeeper.types import Identity, KubeObject

__all__ = ["ANSWERED_FROM_READ", "Engine"]

_JSON = "application/json"
_COLLECTION_VERBS = frozenset({"list", "watch", "deletecollection"})
_OBJECT_VERBS = frozenset({"get", "update", "patch", "delete"})
_READ_METHODS = frozenset({"GET", "HEAD"})
_OPEN_PATHS = frozenset({"/api", "/api/v1", "/apis", "/version", "/openapi/v2", "/openapi/v3"})
# Rules whose objects are named by the request alone: a get reads nothing first.
_NAMED = frozenset({KindRule.OWN_NODE, KindRule.OWN_POD})


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
        """:meth:`screen` then :meth:`accept`: the whole request-level verdict in one call."""
        screened = self.screen(identity, info, plain_json=plain_json)
        return screened if isinstance(screened, Decision) else self.accept(screened, media_type)

    def screen(
        self, identity: Identity, info: RequestInfo, *, plain_json: bool = False
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
        context = CelContext(identity, info, kind, self.policy, self.node_name)
        owner = self._owner(identity, info, kind, version, context)
        if isinstance(owner, Decision):
            return owner
        fetch = None
        named_get = kind.rule in _NAMED and info.verb == "get"
        if (
            info.verb in _OBJECT_VERBS
            and not named_get
            and kind.rule is not KindRule.DRIVER_CREDENTIALS
        ):
            fetch = info.path[: -(len(info.subresource) + 1)] if info.subresource else info.path
        return Plan(
            identity,
            info,
            _JSON,
            kind,
            version,
            self.node_name,
            fetch,
            owner,
            context,
            answer_from_fetch=plain_json and _answerable_get(info),
        )

    def accept(self, plan: Plan, media_type: str, body: Any = None) -> Plan | Decision:
        """``plan`` for ``body`` of ``media_type``; 415 when the kind does not accept it. An
        update that needs no read of the stored object reads none (:func:`_unread_update`)."""
        if unaccepted := unaccepted_encoding(plan.kind, media_type):
            return unaccepted
        plan = replace(plan, media_type=media_type)
        if _unread_update(plan, body):
            plan = replace(plan, fetch=None, unread=True)
        return plan

    def decide(
        self,
        plan: Plan,
        body: Any = None,
        current: KubeObject | None = None,
        stored: Stored | None = None,
    ) -> Decision:
        """Decide a planned request.

        ``current`` is the object read at ``plan.fetch`` (None if absent); ``stored`` the
        conversation's prediction of what a write stores
        (:func:`~gatekeeper.policy.stored.predict`, made once, before any dry run), with the
        upstream's answer when it asked for one. Without one (offline, a caller that predicted
        nothing) a write's is made here, decided on its local result.
        """
        if plan.kind.rule is KindRule.DRIVER_CREDENTIALS:
            raw = body.raw if isinstance(body, EncodedBody) else body
            decision = allow("forwarded under the driver's own credentials", plan.info, raw)
            return replace(decision, media_type=plan.media_type, credentials=Credentials.DRIVER)
        if not isinstance(body, EncodedBody):
            return self._decide_json(plan, body, current, stored)
        # A body only the apiserver decodes: decided as the JSON of its dry run, then
        # forwarded as the driver's own bytes (DESIGN §4.4).
        predicted = stored if stored is not None else predict(plan, body, current)
        proposed = predicted.preview if isinstance(predicted, Stored) else None
        decoded = encoded_json(plan, body, current, proposed)
        if isinstance(decoded, Decision):
            return decoded
        json_plan = replace(plan, media_type=_JSON, decoded=True)
        if decoded is None:
            return self._decide_json(json_plan, decoded, current, None)
        written = predict(json_plan, decoded, current)
        if isinstance(written, Decision):
            return written
        decision = self._decide_json(json_plan, decoded, current, written)
        return encoded_decision(plan, body, decoded, decision, proposed)

    def _decide_json(
        self, plan: Plan, body: Any, current: KubeObject | None, stored: Stored | None
    ) -> Decision:
        info = plan.info
        if info.verb == "deletecollection" and body is not None:
            # The client's DeleteOptions (dry run, preconditions, propagation) go upstream as
            # sent, once known to be DeleteOptions (recordings 163-166).
            options = checked_delete_options(info, plan.kind, body)
            if isinstance(options, Decision):
                return options
            pinned = self._collection(plan)
            return replace(pinned, body=options) if pinned.forwards else pinned
        if info.verb in _COLLECTION_VERBS:
            return self._collection(plan)
        if plan.kind.rule in _NAMED and info.verb == "get":
            return allow(f"the caller's own {plan.kind.kind}, read-only", info)
        return decide_object(plan, body, current, stored)

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
                driver,
                info,
                f'driver "{driver}" is not allowed on node "{self.node_name}"',
                rule=Rule.DRIVER_NOT_ALLOWED,
            )
        if not info.is_resource_request:
            return self._non_resource(driver, info)
        kind = self.policy.kind_for(info.api_group, info.resource, info.verb)
        if kind is None:
            why = "the gatekeeper policy does not allow this resource"
            return forbid(driver, info, why, rule=Rule.KIND_NOT_ALLOWED)
        version = kind.versions.get(info.api_version)
        if version is None:
            why = f"version {info.api_version} of {kind.qualified} is not in the policy"
            return forbid(driver, info, why, rule=Rule.VERSION_NOT_ALLOWED)
        return self._shape(driver, info, kind) or (kind, version)

    def _owner(
        self,
        identity: Identity,
        info: RequestInfo,
        kind: KindSpec,
        version: VersionSpec,
        context: CelContext,
    ) -> Ownership | Decision:
        """The rule's ownership of objects for this caller, or the refusal of a request the rule
        settles on what it names (another node's Node, another pod, another namespace)."""
        driver, rule = identity.driver, kind.rule
        if rule is KindRule.NODE_LOCAL:
            any_node = kind.read_across_nodes and info.verb == "get"
            return NodeLocalOwner(version, driver, self.node_name, any_node=any_node)
        if rule is KindRule.ALLOCATED_TO_DRIVER:
            assert version.allocation is not None  # the loader sets it for this rule
            labels = node_labels_with_hostname(self.node_name, self.node_labels)
            return AllocationScope(version.allocation, driver, self.node_name, labels)
        if rule is KindRule.ON_NODE:
            return OnNodeOwner(version.paths[Field.NODE], self.node_name)
        if rule is KindRule.OWN_NODE:
            listing = info.verb in ("list", "watch")
            if info.name != self.node_name and not listing:
                return self._own_node_only(driver, info, kind)
            return OwnObjectOwner(version.may_change)
        if rule is KindRule.OWN_POD:
            return self._own_pod(identity, info, kind, version)
        if rule is KindRule.DRIVER_NAMESPACE:
            return self._in_namespace(identity, info, kind)
        if rule is KindRule.CEL:
            return CelOwner(version.cel, context, info.verb)
        assert rule is KindRule.DRIVER_CREDENTIALS
        if identity.user is None:
            return forbid(
                driver,
                info,
                f"{kind.qualified} is forwarded under the driver's own credentials, and a driver "
                f"connected by {identity.transport} shows none: connect with its ServiceAccount "
                "token (the token listener)",
                rule=Rule.NO_DRIVER_CREDENTIALS,
            )
        return NamespaceOwner()

    def _own_node_only(self, driver: str, info: RequestInfo, kind: KindSpec) -> Decision:
        # SECURITY: DESIGN §4.3 — nothing else about this kind: no other name, no list or
        # watch (which would show every node), no subresource.
        allowed = [v for v in ("get", "update", "patch") if v in kind.verbs]
        verbs = " or ".join(filter(None, (", ".join(allowed[:-1]), allowed[-1])))
        return forbid(
            driver,
            info,
            f'a driver may only {verbs} this node\'s own {kind.kind} "{self.node_name}" '
            f"({kind.qualified}/{self.node_name})",
            rule=Rule.OWN_OBJECT_ONLY,
        )

    def _own_pod(
        self, identity: Identity, info: RequestInfo, kind: KindSpec, version: VersionSpec
    ) -> Ownership | Decision:
        pod, account = identity.pod, identity.service_account
        if pod is None or account is None:
            return forbid(
                identity.driver,
                info,
                f"the caller's own {kind.kind} is known only from a pod-bound ServiceAccount token "
                "(the token listener)",
                rule=Rule.OWN_OBJECT_ONLY,
            )
        listing = info.verb in ("list", "watch") and info.namespace == account[0]
        if (info.namespace, info.name) != (account[0], pod[0]) and not listing:
            return forbid(
                identity.driver,
                info,
                f'a driver may only reach its own {kind.kind} "{account[0]}/{pod[0]}" (the pod '
                "its token is bound to)",
                rule=Rule.OWN_OBJECT_ONLY,
            )
        return OwnObjectOwner(version.may_change, pod_uid=pod[1])

    def _in_namespace(
        self, identity: Identity, info: RequestInfo, kind: KindSpec
    ) -> Ownership | Decision:
        account = identity.service_account
        namespaces = (
            frozenset({account[0]}) if account else self.policy.namespaces_of(identity.driver)
        )
        if not namespaces:
            return forbid(
                identity.driver,
                info,
                f'driver "{identity.driver}" has no namespace: map its ServiceAccount under '
                "serviceAccounts in the policy",
                rule=Rule.NAMESPACE_NOT_ALLOWED,
            )
        if info.namespace not in namespaces:
            where = f'namespace "{info.namespace}"' if info.namespace else "all namespaces"
            return forbid(
                identity.driver,
                info,
                f"{kind.qualified} is allowed only in the driver's own namespace "
                f"({', '.join(sorted(namespaces))}), not in {where}",
                rule=Rule.NAMESPACE_NOT_ALLOWED,
            )
        return NamespaceOwner()

    def _non_resource(self, driver: str, info: RequestInfo) -> Decision:
        if info.method in _READ_METHODS and self._open_path(info.path):
            return allow("discovery and version paths are open to drivers", info)
        why = "only discovery of the policy's API groups is allowed"
        return forbid(driver, info, why, rule=Rule.DISCOVERY_NOT_ALLOWED)

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
            why = f'subresource "{info.subresource}" is not in the policy'
            return forbid(driver, info, why, rule=Rule.SUBRESOURCE_NOT_ALLOWED)
        if info.verb not in kind.verbs and kind.rule is KindRule.OWN_NODE:
            # A list, a watch, a create of nodes: what the rule allows is one object, by name.
            return self._own_node_only(driver, info, kind)
        if info.verb not in kind.verbs:
            why = f"verb {info.verb} is not allowed on {kind.qualified}"
            return forbid(driver, info, why, rule=Rule.VERB_NOT_ALLOWED)
        if kind.rule is KindRule.ALLOCATED_TO_DRIVER and (refused := request_refusal(info)):
            return forbid(driver, info, refused, rule=Rule.STATUS_SUBRESOURCE_ONLY)
        return None

    def _collection(self, plan: Plan) -> Decision:
        """list, watch, deletecollection: pinned by field selector, filtered object by object,
        or (rule DriverNamespace) bounded by the path's namespace."""
        info, kind, owner = plan.info, plan.kind, plan.owner
        if owner.hidden:
            if info.query_value("continue") is not None:
                message = (
                    f"continue is not accepted for {kind.qualified}: {CONTINUE_REFUSED}; list "
                    "again without continue"
                )
                return deny(400, CONTINUE_REFUSED, message, rule=Rule.CONTINUE_REFUSED)
            # SECURITY: docs/operating.md#filtered-reads — answered in full: the driver's limit
            # is not passed on (the proxy pages the upstream itself and hands out no continue
            # token).
            target = info.with_query("limit", None)
            assert callable(owner)
            return allow(
                "objects are filtered to the driver's own, object by object", target, filter=owner
            )
        if kind.rule is KindRule.DRIVER_NAMESPACE:
            return allow("objects in the driver's namespace", info)
        if kind.rule is KindRule.OWN_NODE:
            # SECURITY: DESIGN §4.3 — the one object, by name: an informer of the node's Node.
            return self._pin_selector(plan, {"metadata.name": self.node_name})
        if kind.rule is KindRule.OWN_POD:
            pod = plan.identity.pod
            assert pod is not None  # _own_pod refused a caller without one
            return self._pin_selector(plan, {"metadata.name": pod[0]})
        selectors = plan.version.selectors
        wanted = {selectors[Field.NODE]: self.node_name}
        if kind.rule is KindRule.NODE_LOCAL:
            wanted = {selectors[Field.DRIVER]: plan.driver, **wanted}
            if kind.read_across_nodes and info.verb != "deletecollection":
                # The driver's own objects on every node (readAcrossNodes): a node-owned slice
                # of ReconcilePoolWithName has no node name to select on.
                del wanted[selectors[Field.NODE]]
        return self._pin_selector(plan, wanted)

    def _pin_selector(self, plan: Plan, wanted: Mapping[str, str]) -> Decision:
        info, kind, version, driver = plan.info, plan.kind, plan.version, plan.driver
        try:
            terms = parse_field_selector(info.query_value("fieldSelector") or "")
        except ValueError as exc:
            return deny(400, f"invalid fieldSelector: {exc}", rule=Rule.BAD_QUERY)
        if info.verb == "deletecollection" and (
            problem := collection_pool_violation(version, terms, self.node_name)
        ):
            return forbid(driver, info, problem)
        missing: list[FieldRequirement] = []
        for key, want in wanted.items():
            pinned = [t.value for t in terms if t.field == key and t.operator == "="]
            if any(value != want for value in pinned):
                other = next(value for value in pinned if value != want)
                why = f'fieldSelector pins {key}="{other}", not "{want}"'
                return forbid(driver, info, why, rule=Rule.SELECTOR_REQUIRED)
            if not pinned:
                missing.append(FieldRequirement(key, "=", want))
        what = ", ".join(f"{key}={value}" for key, value in wanted.items())
        if not missing:
            return allow(f"field selector pins {what}", info)
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
            rule=Rule.SELECTOR_REQUIRED,
        )


def _unread_update(plan: Plan, body: Any) -> bool:
    """Whether an update is decided on its body alone, with no read of the stored object.

    SECURITY: docs/security.md "Updates without a read" — when every ownership field the kind
    locates is one the apiserver refuses to change (the policy's ``apiserverImmutable``), a body
    naming the caller, this node (by name) and a pool under it can only update an object that
    names them too (another object's fields would have to change: 422), and the
    resourceVersion it carries makes the apiserver refuse it (409) if the object changed since
    the driver read it. A body without one still needs the read, to be pinned; so does CEL that
    names ``oldObject``.
    """
    version = plan.version
    if (
        plan.info.verb != "update"
        or plan.info.subresource
        or plan.kind.rule is not KindRule.NODE_LOCAL
    ):
        return False
    if not version.owner_fields_immutable or version.cel.reads_stored:
        return False
    if isinstance(body, EncodedBody):
        return bool(body.resource_version) and body.envelope is not None
    if not isinstance(body, dict) or not requested_resource_version(body):
        return False
    if maintained_change(body, {}) is not None:
        # managedFields (or another apiserver-maintained field) restated: compared with what is
        # stored, which needs the read.
        return False
    if holds_null(body):
        # Decided on the apiserver's dry run (stored.predict), which is asked only about an
        # object read first and known to be the caller's.
        return False
    # A node-owned object (no node name, a node selector) is not bound by an immutable name.
    node = get_field(body, version.paths[Field.NODE])
    return isinstance(node, str) and bool(node)


_ANSWERABLE_QUERY = frozenset({"resourceVersion"})


def _answerable_get(info: RequestInfo) -> bool:
    """Whether the gatekeeper's read (the latest object, no query) is the answer to this get:
    no query, or only ``resourceVersion`` "" or "0" (any version will do)."""
    return info.verb == "get" and all(
        key in _ANSWERABLE_QUERY and value in ("", "0") for key, value in info.query
    )
