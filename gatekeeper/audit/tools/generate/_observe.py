"""What a log shows of each resource a driver used: its allowed requests, grouped by all that
decides their rule (requests alike are counted, not kept), and the objects they carried.

Memory grows with the shapes of the traffic and the objects in the log, not with its length.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gatekeeper.audit.event import FORWARDED_ANNOTATION
from gatekeeper.audit.tools.generate._changes import Change, changes_of
from gatekeeper.audit.tools.generate._fields import fields_holding
from gatekeeper.audit.tools.reader import Record
from gatekeeper.audit.tools.replay import method_of
from gatekeeper.codec.jsonpath import FieldPath, get_field
from gatekeeper.codec.selectors import parse_field_selector
from gatekeeper.errors import Refusal
from gatekeeper.policy import KindRule, Policy, Scope
from gatekeeper.request.encoded import encoding_name
from gatekeeper.request.requestinfo import RequestInfo, parse_request
from gatekeeper.types import POD_NAME_EXTRA, KubeObject

__all__ = [
    "Caller",
    "Observation",
    "Observed",
    "Owned",
    "Traffic",
    "is_kind_object",
    "object_path",
    "observe",
    "remember",
]

Owned = list[tuple[KubeObject, str, str]]
"""Logged objects, each with the driver and node of the request that carried it."""
_SA_PREFIX = "system:serviceaccount:"
_STORED_BY = frozenset({"get", "create", "update", "patch"})
_WRITES = frozenset({"update", "patch"})
# The kinds of the resources the node-local rules are about, for logs that carry no object
# (Metadata level): their kind name is not otherwise in the log.
_CORE_KINDS = {
    ("", "nodes"): ("Node", Scope.CLUSTER),
    ("", "pods"): ("Pod", Scope.NAMESPACED),
    ("", "events"): ("Event", Scope.NAMESPACED),
}
_OWN_RULES = frozenset({KindRule.OWN_NODE, KindRule.OWN_POD})


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request, as far as the log shows."""

    driver: str
    node: str
    token: bool
    """It showed a ServiceAccount token (the token listener, or the kube-apiserver's own log):
    a request forwarded under its own credentials would have one to carry."""
    account: tuple[str, str] | None = None
    """(namespace, name) of its ServiceAccount."""
    pod: str | None = None
    """The pod its token is bound to."""
    namespaces: frozenset[str] = frozenset()
    """Its own namespaces: its token's, else those the base policy maps the driver to."""


@dataclass(slots=True)
class Observed:
    """Allowed requests alike in all that decides their rule; the first is the example."""

    record: Record
    info: RequestInfo
    caller: Caller
    selector: frozenset[tuple[str, str]] = frozenset()
    """The ``field=value`` terms of the field selector the driver sent."""
    forwarded: frozenset[tuple[str, str]] = frozenset()
    """The same of the selector the gatekeeper forwarded (after it injected terms)."""
    node_fields: frozenset[FieldPath] | None = None
    """The fields of the object the response carried (what a get read) that held the caller's
    node; None when the log does not hold the object."""
    changes: frozenset[Change] | None = frozenset()
    """What a write of a possible own object (a Node, a Pod) changed; None when the log cannot
    show it (no body, or an update without the object before it)."""
    encoding: str = ""
    """The body's encoding, when the gatekeeper's log names it (``protobuf``, ``cbor``)."""
    count: int = 1


@dataclass(slots=True)
class Traffic:
    """What the log shows of one (group, resource)."""

    group: str
    resource: str
    kind: str = ""
    namespaced: bool = False
    """Namespaced: the base policy says so, else a request or an object named a namespace."""
    requests: list[Observed] = field(default_factory=list)
    owned: dict[str, Owned] = field(default_factory=dict)
    """(object, driver, node) of every object of each version in the log."""
    shapes: dict[tuple[Any, ...], Observed] = field(default_factory=dict)

    @property
    def qualified(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def objects(self, version: str) -> Owned:
        return self.owned.get(version, [])


@dataclass(slots=True)
class Observation:
    """Everything ``audit generate`` reads from a log."""

    drivers: set[str] = field(default_factory=set)
    accounts: dict[tuple[str, str], str] = field(default_factory=dict)
    """(namespace, name) of each ServiceAccount seen → its driver."""
    traffic: dict[tuple[str, str], Traffic] = field(default_factory=dict)


def observe(records: Iterable[Record], base: Policy) -> Observation:
    """The allowed requests of drivers in ``records``, by resource."""
    seen = Observation()
    stored: dict[str, KubeObject] = {}
    own_kinds: dict[tuple[str, str], bool] = {}
    for record, info in _allowed(records):
        assert record.driver is not None
        seen.drivers.add(record.driver)
        caller = _caller(record, base)
        if caller.account is not None:
            seen.accounts.setdefault(caller.account, caller.driver)
        if not info.is_resource_request:
            continue
        key = (info.api_group, info.resource)
        traffic = seen.traffic.get(key) or seen.traffic.setdefault(key, Traffic(*key))
        objects = [o for o in (record.request_object, record.response_object) if is_kind_object(o)]
        for obj in objects:
            traffic.owned.setdefault(info.api_version, []).append((obj, caller.driver, caller.node))
            traffic.kind = traffic.kind or str(obj["kind"])
            # A cluster-wide list names no namespace; its objects do.
            traffic.namespaced |= bool(get_field(obj, ("metadata", "namespace")))
        traffic.namespaced |= bool(info.namespace)
        own = own_kinds.get(key)
        if own is None:
            own = own_kinds[key] = _may_be_own(key, base)
        _count(traffic, _observed(record, info, caller, stored if own else None))
        if own:
            remember(stored, record, info)
    for key, traffic in seen.traffic.items():
        _kind_of(traffic, base.kind_for(*key), _CORE_KINDS.get(key))
    return seen


def _kind_of(traffic: Traffic, known: Any, core: tuple[str, Scope] | None) -> None:
    traffic.kind = (known.kind if known else "") or traffic.kind or (core[0] if core else "")
    if known is not None:
        traffic.namespaced = known.scope is Scope.NAMESPACED
    elif core is not None:
        traffic.namespaced = core[1] is Scope.NAMESPACED


def _may_be_own(key: tuple[str, str], base: Policy) -> bool:
    """A resource whose writes may be of an own object (their changes are read)."""
    known = base.kind_for(*key)
    listed = known is not None and any(entry.rule in _OWN_RULES for entry in known.entries)
    return key in (("", "nodes"), ("", "pods")) or listed


def _count(traffic: Traffic, seen: Observed) -> None:
    info = seen.info
    shape = (
        info.verb, info.api_version, info.namespace, info.name, info.subresource, seen.caller,
        seen.selector, seen.forwarded, seen.node_fields, seen.changes, seen.encoding,
        seen.record.source, seen.record.level,
    )  # fmt: skip
    known = traffic.shapes.get(shape)
    if known is None:
        traffic.shapes[shape] = seen
        traffic.requests.append(seen)
    else:
        known.count += 1


def _allowed(records: Iterable[Record]) -> Iterator[tuple[Record, RequestInfo]]:
    for record in records:
        if record.decision != "allow" or record.driver is None:
            continue
        try:
            info = parse_request(method_of(record.verb), record.request_uri)
        except Refusal:
            continue  # the gatekeeper refuses this target whatever the policy says
        yield record, info


def _caller(record: Record, base: Policy) -> Caller:
    assert record.driver is not None
    user = record.token_user
    if user is None:
        namespaces = base.namespaces_of(record.driver)
        return Caller(record.driver, record.node, False, namespaces=namespaces)
    account = None
    if user.username.startswith(_SA_PREFIX):
        namespace, _, name = user.username.removeprefix(_SA_PREFIX).partition(":")
        account = (namespace, name) if namespace and name else None
    return Caller(
        record.driver,
        record.node,
        True,
        account=account,
        pod=user.first_extra(POD_NAME_EXTRA),
        namespaces=frozenset({account[0]}) if account else frozenset(),
    )


def _observed(
    record: Record, info: RequestInfo, caller: Caller, stored: dict[str, KubeObject] | None
) -> Observed:
    answer = record.response_object if is_kind_object(record.response_object) else None
    changes: frozenset[Change] | None = frozenset()
    if stored is not None and info.verb in _WRITES:
        before = stored.get(object_path(info))
        changed = changes_of(info.verb, record.request_object, before)
        changes = None if changed is None else frozenset(changed)
    selector = _selector(info)
    forwarded = _forwarded_selector(record, info)
    encoding = ""
    if record.content_type and info.verb in ("create", "update"):
        encoding = encoding_name(record.content_type)
    return Observed(
        record,
        info,
        caller,
        selector,
        selector if forwarded is None else forwarded,
        fields_holding(answer, caller.node) if answer is not None else None,
        changes,
        encoding,
    )


def is_kind_object(obj: Any) -> bool:
    """An object of the kind itself (not a Status, DeleteOptions or list)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        return False
    return obj["kind"] not in ("Status", "DeleteOptions") and not obj["kind"].endswith("List")


def _selector(info: RequestInfo) -> frozenset[tuple[str, str]]:
    return _pinned(info.query_value("fieldSelector") or "")


@lru_cache(maxsize=1024)
def _pinned(selector: str) -> frozenset[tuple[str, str]]:
    """The ``field=value`` terms of a field selector (a driver sends the same few again)."""
    try:
        terms = parse_field_selector(selector)
    except ValueError:
        return frozenset()
    return frozenset((term.field, term.value) for term in terms if term.operator == "=")


def _forwarded_selector(record: Record, info: RequestInfo) -> frozenset[tuple[str, str]] | None:
    """The selector of the request the gatekeeper forwarded instead, when its log says so."""
    forwarded = record.annotations.get(FORWARDED_ANNOTATION, "")
    method, _, target = forwarded.partition(" ")
    if not target or info.verb not in ("list", "watch", "deletecollection"):
        return None
    try:
        return _selector(parse_request(method, target))
    except Refusal:
        return None


def object_path(info: RequestInfo) -> str:
    return info.path[: -(len(info.subresource) + 1)] if info.subresource else info.path


def remember(stored: dict[str, KubeObject], record: Record, info: RequestInfo) -> None:
    """The stored object after a request that succeeded, as far as the log shows it."""
    if record.code >= 300:
        return
    path = object_path(info)
    if info.verb == "delete":
        stored.pop(path, None)
        return
    if info.verb not in _STORED_BY:
        return
    answer = record.response_object if is_kind_object(record.response_object) else None
    body = record.request_object if is_kind_object(record.request_object) else None
    obj = answer or (body if info.verb in ("create", "update") else None)
    if obj is None:
        if info.verb != "get":
            stored.pop(path, None)  # changed in a way the log does not show
        return
    if info.verb == "create":
        name = obj.get("metadata", {}).get("name")
        if not isinstance(name, str) or not name:
            return
        path = f"{info.path}/{name}"
    stored[path] = obj
