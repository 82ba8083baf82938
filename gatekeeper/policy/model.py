"""The policy, as immutable values. The engine sees only these, never raw YAML."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from gatekeeper.codec.jsonpath import FieldPath
from gatekeeper.policy.cel import CelRules

__all__ = [
    "ALLOCATED_VERBS",
    "ALL_VERBS",
    "ANY_DRIVER",
    "BUILT_IN_GROUPS",
    "ENCODINGS",
    "OWN_NODE_VERBS",
    "POOL_SEPARATORS",
    "RULE_VERBS",
    "STRICT_POOL_SEPARATORS",
    "AllocationPaths",
    "Changeable",
    "Credentials",
    "Field",
    "KindRule",
    "KindSpec",
    "ListSelectorMode",
    "Policy",
    "Scope",
    "UnboundTokens",
    "VersionSpec",
]

ANY_DRIVER = "*"
ALL_VERBS = frozenset(
    {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
)
ALLOCATED_VERBS = frozenset({"get", "list", "watch", "update", "patch"})
"""The verbs an AllocatedToDriver kind may allow: reads, and writes of its status."""
OWN_NODE_VERBS = frozenset({"get", "list", "watch", "update", "patch"})
"""The verbs an OwnNode or OwnPod kind may allow: reading the one object (a list or watch of
it by ``fieldSelector=metadata.name=<name>``, as an informer of one object does), and changing
what its ``mayChange`` names."""
POOL_SEPARATORS = ("/", "-", ".")
"""What a policy may let follow the node name in a pool name (``poolSeparators``)."""
ENCODINGS = ("json", "protobuf", "cbor")
"""Request body encodings a kind may accept (``encodings``). JSON is read by the gatekeeper;
protobuf and CBOR are decoded by the apiserver in a dry run, which only built-in kinds allow."""
BUILT_IN_GROUPS = frozenset(
    {
        "",
        "admissionregistration.k8s.io",
        "apiextensions.k8s.io",
        "apps",
        "authentication.k8s.io",
        "authorization.k8s.io",
        "autoscaling",
        "batch",
        "certificates.k8s.io",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
        "flowcontrol.apiserver.k8s.io",
        "networking.k8s.io",
        "node.k8s.io",
        "policy",
        "rbac.authorization.k8s.io",
        "resource.k8s.io",
        "scheduling.k8s.io",
        "storage.k8s.io",
        "storagemigration.k8s.io",
    }
)
"""The API groups a kube-apiserver serves itself, validated by code compiled into it. A kind of
any other group is a custom resource (``devmgmtproto.k8s.io``, ``example.com``): what its
apiserver refuses is whatever the cluster's CRD says today."""
STRICT_POOL_SEPARATORS: tuple[str, ...] = ("/",)
"""The default: ``<node>`` or ``<node>/<rest>``. ``/`` cannot occur in a node name, so no
node's pool names can collide with another's; ``-`` and ``.`` can (docs/policy.md#pool-names)."""


class Scope(enum.Enum):
    CLUSTER = "Cluster"
    NAMESPACED = "Namespaced"


class KindRule(enum.Enum):
    """How objects of a kind are owned.

    NODE_LOCAL: every object names its driver, its node and (optionally) a pool prefixed by
    the node name; a driver reads and writes only its own objects on this node.

    ALLOCATED_TO_DRIVER: objects are allocated by someone else (the scheduler) to drivers and
    nodes; a driver reads only objects with an allocation result of its own on this node, and
    writes only its own entries of a status list, through the ``status`` subresource.
    """

    NODE_LOCAL = "NodeLocal"
    ALLOCATED_TO_DRIVER = "AllocatedToDriver"
    OWN_NODE = "OwnNode"
    """The node object of this node itself (core/v1 Node ``<node name>``): get, and a write that
    changes only what ``mayChange`` names (labels under the driver's prefix); nothing else about
    nodes (the DRA publisher reads its Node for the owner reference of its slices)."""
    OWN_POD = "OwnPod"
    """The caller's own pod, named by its ServiceAccount token (pod-name, pod-uid extras): get,
    and a write that changes only what ``mayChange`` names."""
    ON_NODE = "OnNode"
    """Objects placed on this node by a node field (Pods' ``spec.nodeName``): read-only, a list or
    watch pinned to this node by its field selector."""
    DRIVER_NAMESPACE = "DriverNamespace"
    """Objects in the namespace of the caller's ServiceAccount (Events, Leases, Deployments)."""
    CEL = "CEL"
    """Objects bound to the caller by the version's CEL ``scope`` alone: reads are filtered by
    it object by object, a write must be in scope before and after (DeviceTaintRules)."""
    DRIVER_CREDENTIALS = "DriverCredentials"
    """Forwarded with the driver's own ServiceAccount token (token listener only): the
    apiserver's RBAC for the driver decides, as if it had gone direct (its own CRDs)."""


RULE_VERBS: Mapping[KindRule, frozenset[str]] = {
    KindRule.NODE_LOCAL: ALL_VERBS,
    KindRule.ALLOCATED_TO_DRIVER: ALLOCATED_VERBS,
    KindRule.OWN_NODE: OWN_NODE_VERBS,
    KindRule.OWN_POD: OWN_NODE_VERBS,
    KindRule.ON_NODE: frozenset({"get", "list", "watch"}),
    KindRule.DRIVER_NAMESPACE: ALL_VERBS,
    KindRule.CEL: ALL_VERBS - {"deletecollection"},
    KindRule.DRIVER_CREDENTIALS: ALL_VERBS,
}
"""The verbs each rule can decide; a kind's ``verbs`` are a subset."""


class Credentials(enum.Enum):
    """Whose credentials a forwarded request carries upstream."""

    GATEKEEPER = "gatekeeper"
    """The gatekeeper's own (its kubeconfig or in-cluster ServiceAccount)."""
    DRIVER = "driver"
    """The driver's own bearer token, exactly as it sent it (rule DriverCredentials)."""


class ListSelectorMode(enum.Enum):
    """What list/watch/deletecollection must carry (DESIGN §4.3)."""

    REQUIRE = "Require"  # refuse unless the field selector pins driver and node
    INJECT = "Inject"  # add the missing pinning terms before forwarding


class Field(enum.Enum):
    """The ownership fields a version locates by path."""

    DRIVER = "driver"
    NODE = "node"
    POOL = "pool"


@dataclass(frozen=True, slots=True)
class AllocationPaths:
    """Where one API version of an AllocatedToDriver kind keeps its allocation and status.

    ``result_driver`` and ``device_driver`` are relative to one list entry.
    """

    results: FieldPath
    """The list of allocation results (``status.allocation.devices.results``)."""
    result_driver: FieldPath
    """The driver of one result (``driver``)."""
    node_selector: FieldPath
    """The core/v1 NodeSelector saying where the allocation is usable."""
    devices: FieldPath
    """The per-device status list drivers write (``status.devices``)."""
    device_driver: FieldPath
    """The driver owning one status entry (``driver``)."""
    opaque: tuple[FieldPath, ...] = ()
    """Where the apiserver keeps JSON exactly as sent (RawExtension, e.g. ``status.devices.data``;
    a step over a list applies to each item): compared exactly, not by meaning."""
    times: tuple[FieldPath, ...] = ()
    """Where the apiserver stores a time (metav1.Time or MicroTime, e.g.
    ``status.devices.conditions.lastTransitionTime``; list steps implicit): a string there is
    compared by the instant it denotes. Every other string is compared exactly."""


@dataclass(frozen=True, slots=True)
class Changeable:
    """What a write of an OwnNode or OwnPod object may change (``mayChange``): the subtree at
    ``path``, or with ``keys`` only those keys of the map there (``prefix/*`` patterns)."""

    path: FieldPath
    keys: tuple[str, ...] = ()

    def allows_key(self, key: str) -> bool:
        return any(
            key.startswith(pattern[:-1]) if pattern.endswith("*") else key == pattern
            for pattern in self.keys
        )


@dataclass(frozen=True, slots=True)
class VersionSpec:
    """Where one API version keeps the ownership fields, and what it may not carry.

    A NodeLocal kind fills ``paths``/``selectors``/``forbidden``; an AllocatedToDriver kind
    fills ``allocation`` and leaves the others empty.
    """

    paths: Mapping[Field, FieldPath]
    """JSON paths of driver, node and (optional) pool in objects of this version."""
    selectors: Mapping[Field, str]
    """Field-selector keys that pin driver and node on list/watch/deletecollection."""
    forbidden: tuple[FieldPath, ...] = ()
    """Paths that must be absent (or null/false) on a written object."""
    allocation: AllocationPaths | None = None
    """Paths of an AllocatedToDriver kind (None for NodeLocal)."""
    apiserver_immutable: frozenset[Field] = frozenset()
    """Ownership fields the apiserver itself refuses to change on an existing object (422
    ``field is immutable``): the policy's ``apiserverImmutable``, a security assertion. When
    every field in ``paths`` is, an apply that creates is forwarded as an apply: should someone
    create the name first, the apiserver refuses the apply rather than let it take the object
    over (DESIGN §4.4)."""

    pool_separators: tuple[str, ...] = STRICT_POOL_SEPARATORS
    """What may follow the node name in a pool name (the kind's ``poolSeparators``)."""
    cel: CelRules = field(default_factory=CelRules)
    """The CEL variables and validations of the kind and this version, and rule CEL's scope."""
    may_change: tuple[Changeable, ...] = ()
    """What a write of an OwnNode or OwnPod object may change; everything else stays as stored."""
    node_selector: FieldPath | None = None
    """NodeLocal: where an object may name its node by a node selector instead (a node-owned
    ResourceSlice of ``ReconcilePoolWithName``): one naming this node and no other."""

    @property
    def owner_fields_immutable(self) -> bool:
        """Whether every ownership field this version locates is immutable."""
        return bool(self.paths) and set(self.paths) <= self.apiserver_immutable


@dataclass(frozen=True, slots=True)
class KindSpec:
    group: str
    resource: str
    kind: str
    scope: Scope
    rule: KindRule
    versions: Mapping[str, VersionSpec]
    verbs: frozenset[str] = ALL_VERBS
    subresources: frozenset[str] = frozenset()
    list_selector: ListSelectorMode = ListSelectorMode.REQUIRE
    fill: frozenset[Field] = frozenset()
    pool_separators: tuple[str, ...] = STRICT_POOL_SEPARATORS
    """What may follow the node name in a pool name; every version carries it too."""
    encodings: frozenset[str] = frozenset({"json"})
    """Request body encodings accepted (:data:`ENCODINGS`); a body in another is 415."""
    apiserver_immutable_confirmed: bool = False
    """The policy confirms (``apiserverImmutableConfirmed``) that this kind, outside the
    :data:`BUILT_IN_GROUPS`, has its apiserver refuse changes to the ``apiserverImmutable``
    fields (a CRD validation rule), so its versions may assert it."""
    read_across_nodes: bool = False
    """NodeLocal: a driver reads its own objects on every node (``readAcrossNodes``): a list or
    watch pins only the driver, a get checks only the driver. Writes stay node-local."""
    alternatives: tuple[KindSpec, ...] = ()
    """The same resource listed under other rules, each with verbs of its own (Pods read on
    this node by rule OnNode, the caller's own pod patched by rule OwnPod)."""

    @property
    def qualified(self) -> str:
        """``resourceslices.resource.k8s.io`` (``secrets`` for the core group)."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def entries(self) -> tuple[KindSpec, ...]:
        """This kind under each rule it is listed under."""
        return (replace(self, alternatives=()), *self.alternatives)

    def for_verb(self, verb: str) -> KindSpec:
        """The entry whose rule decides ``verb`` (this one when none does: it refuses)."""
        if verb in self.verbs or not self.alternatives:
            return self
        return next((other for other in self.alternatives if verb in other.verbs), self)

    @property
    def all_verbs(self) -> frozenset[str]:
        return self.verbs.union(*(other.verbs for other in self.alternatives))


class UnboundTokens(enum.Enum):
    """``unboundTokens``: a service-account token that names no node (a TokenRequest not bound
    to a pod, a legacy Secret token) cannot show that its driver runs on this node."""

    REFUSE = "Refuse"
    ALLOW = "Allow"


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded, validated policy. ``source`` names the file for messages."""

    kinds: Mapping[tuple[str, str], KindSpec]
    """Keyed by (group, resource)."""
    drivers: frozenset[str] = frozenset()
    source: str = "<policy>"
    groups: frozenset[str] = field(default=frozenset())
    service_accounts: Mapping[str, str] = field(default_factory=dict)
    """``system:serviceaccount:<namespace>:<name>`` → the driver whose token it is
    (``serviceAccounts``); a service account maps to one driver at most."""
    unbound_tokens: UnboundTokens = UnboundTokens.REFUSE
    """Whether a token without the node-name extra (unbound, legacy) may identify a driver."""
    files: tuple[str, ...] = ()
    """Every file on disk the policy was read from: ``source`` and the files it includes (a
    packaged policy is not one: it changes only with the gatekeeper). A reload watches them."""

    def kind_for(self, group: str, resource: str, verb: str = "") -> KindSpec | None:
        """The kind of ``group``/``resource``; with ``verb``, its entry whose rule decides it."""
        kind = self.kinds.get((group, resource))
        return kind.for_verb(verb) if kind is not None and verb else kind

    def allows_driver(self, driver: str) -> bool:
        return driver in self.drivers or ANY_DRIVER in self.drivers

    def namespaces_of(self, driver: str) -> frozenset[str]:
        """The namespaces of the ServiceAccounts the policy maps to ``driver``."""
        return frozenset(
            user.split(":")[2] for user, mapped in self.service_accounts.items() if mapped == driver
        )

    def with_drivers(self, extra: frozenset[str]) -> Policy:
        return replace(self, drivers=self.drivers | extra)
