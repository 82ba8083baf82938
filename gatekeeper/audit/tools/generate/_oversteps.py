"""The refused cases of a generated policy-test file: for an allowed case of each kind and verb,
the same request overstepping what its rule allows, one way at a time (another node, another
driver, a pool outside the node's prefix, another namespace, a label key outside ``mayChange``,
another pod), each expected refused with nothing forwarded.

Derived from the generated policy's entry (its rule and paths), so they test what the policy
says, on the objects the log showed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from gatekeeper.codec.jsonpath import MISSING, FieldPath, get_field, set_field
from gatekeeper.codec.selectors import parse_field_selector
from gatekeeper.policy import Field, KindRule, KindSpec, VersionSpec
from gatekeeper.policy.model import POOL_SEPARATORS, ListSelectorMode
from gatekeeper.request.requestinfo import RequestInfo, parse_request

__all__ = ["Case", "Overstep", "oversteps", "token_elsewhere"]

Case = dict[str, Any]
"""One case of a policy-test file, as the file writes it (docs/policy-tests.md)."""
Overstep = tuple[str, Case]
"""What a case oversteps (its name's end), and the case."""

_OTHER_DRIVER = ("other.example.com", "another.example.com")
_OUTSIDE_KEY = "outside.example.com/key"
_HIDDEN = 404
"""A claim not allocated to the caller on this node reads as absent (DESIGN §4.3)."""


def _other_node(node: str) -> str:
    """A node name that is not ``node`` (nor prefixed by it)."""
    return "elsewhere" if not node.startswith("elsewhere") else "another-node"


def _other_driver(driver: str) -> str:
    return _OTHER_DRIVER[driver == _OTHER_DRIVER[0]]


def token_elsewhere(case: Case, node: str) -> Overstep | None:
    """The same request with a token of a pod on another node (a token caller's case)."""
    token = case.get("token")
    if not token or "pod" not in token:
        return None
    refused = _refused(case, 403)
    refused["token"] = {**token, "node": _other_node(node)}
    return "with a token of a pod on another node", refused


def oversteps(case: Case, entry: KindSpec, verb: str, node: str, driver: str) -> list[Overstep]:
    """The refused variants of the allowed ``case`` of ``verb`` under ``entry``'s rule."""
    version = parse_request("GET", case["request"]["path"]).api_version
    spec = entry.versions.get(version)
    if spec is None:
        return []
    where = _Where(node, driver, spec, entry)
    make = _BY_RULE.get(entry.rule)
    return list(make(case, verb, where)) if make is not None else []


class _Where:
    """The caller's node and driver, the other ones, and the entry's paths."""

    def __init__(self, node: str, driver: str, spec: VersionSpec, entry: KindSpec) -> None:
        self.node, self.driver = node, driver
        self.other_node, self.other_driver = _other_node(node), _other_driver(driver)
        self.spec, self.entry = spec, entry

    def elsewhere(self, obj: Any, under: FieldPath) -> Any:
        """``obj`` with every string under ``under`` naming this node (or a pool prefixed by
        it) naming the other node instead."""
        return _replace(obj, under, self._moved)

    def moved(self, obj: Any) -> Any:
        """``obj`` with its node field (and a pool prefixed by the node, but not its name)
        naming the other node: an object of the same driver on another node."""
        moved = _set(obj, self.spec.paths[Field.NODE], self.other_node)
        pool = self.spec.paths.get(Field.POOL)
        if pool is not None and pool != ("metadata", "name"):
            value = get_field(moved, pool)
            if isinstance(value, str) and (renamed := self._moved(value)) is not None:
                set_field(moved, pool, renamed)
        return moved

    def _moved(self, value: str) -> str | None:
        if value == self.node:
            return self.other_node
        if any(value.startswith(self.node + sep) for sep in POOL_SEPARATORS):
            return self.other_node + value[len(self.node) :]
        return None

    def other_drivers(self, obj: Any) -> Any:
        return _replace(obj, (), lambda value: self.other_driver if value == self.driver else None)


def _node_local(case: Case, verb: str, where: _Where) -> Iterator[Overstep]:
    paths = where.spec.paths
    if verb in ("list", "watch", "deletecollection"):
        yield from _pinned_lists(case, verb, where)
        return
    body = case["request"].get("body")
    if verb in ("create", "update") and isinstance(body, dict):
        yield "naming another node", _with_body(case, where.moved(body))
        yield (
            "naming another driver",
            _with_body(case, _set(body, paths[Field.DRIVER], where.other_driver)),
        )
        pool = paths.get(Field.POOL)
        if pool is not None and (verb == "create" or pool != ("metadata", "name")):
            outside = _set(body, pool, f"not-{where.node}")
            yield "with a pool outside the node's prefix", _with_body(case, outside)
    existing = case.get("existing") or []
    if verb in ("get", "delete", "patch") and existing and not where.entry.read_across_nodes:
        stored = existing[0]
        yield "of an object of another node", _with_existing(case, where.moved(stored))
        yield (
            "of another driver's object",
            _with_existing(case, _set(stored, paths[Field.DRIVER], where.other_driver)),
        )


def _pinned_lists(case: Case, verb: str, where: _Where) -> Iterator[Overstep]:
    """A list or watch pinned to another node or driver; one pinned to nothing (Require)."""
    spec, entry = where.spec, where.entry
    request = case["request"]
    info = parse_request("GET", f"{request['path']}?{request.get('query', '')}")
    try:
        terms = {
            term.field: term.value
            for term in parse_field_selector(info.query_value("fieldSelector") or "")
            if term.operator == "="
        }
    except ValueError:
        return
    across = entry.read_across_nodes and verb != "deletecollection"
    others = {spec.selectors[Field.NODE]: ("another node", where.other_node)}
    if Field.DRIVER in spec.selectors:
        others[spec.selectors[Field.DRIVER]] = ("another driver", where.other_driver)
    for key, (what, value) in others.items():
        if key in terms and not (across and key == spec.selectors[Field.NODE]):
            pinned = ",".join(f"{k}={value if k == key else v}" for k, v in terms.items())
            yield f"pinned to {what}", _with_query(case, info, pinned)
    if entry.list_selector is ListSelectorMode.REQUIRE and terms:
        yield "without a field selector", _with_query(case, info, None)


def _allocated(case: Case, verb: str, where: _Where) -> Iterator[Overstep]:
    """A claim allocated to another driver, or on another node: it reads as absent."""
    allocation = where.spec.allocation
    existing = case.get("existing") or []
    if allocation is None or not existing or verb in ("list", "watch"):
        return
    stored = existing[0]
    results = get_field(stored, allocation.results)
    if isinstance(results, list) and results:
        other = copy.deepcopy(stored)
        for result in get_field(other, allocation.results):
            if isinstance(result, dict):
                set_field(result, allocation.result_driver, where.other_driver)
        yield "allocated to another driver", _with_existing(case, other, code=_HIDDEN)
    if get_field(stored, allocation.node_selector) is not MISSING:
        elsewhere = where.elsewhere(stored, allocation.node_selector)
        yield "allocated on another node", _with_existing(case, elsewhere, code=_HIDDEN)
    body = case["request"].get("body")
    if verb == "update" and isinstance(body, dict):
        yield from _other_entry(case, body, stored, where)


def _other_entry(case: Case, body: Case, stored: Case, where: _Where) -> Iterator[Overstep]:
    """A status write changing another driver's entry of the device list."""
    allocation = where.spec.allocation
    assert allocation is not None
    entry: dict[str, Any] = {"pool": where.node, "device": "other-device"}
    before, after = copy.deepcopy(stored), copy.deepcopy(body)
    for obj, state in ((before, "before"), (after, "after")):
        devices = get_field(obj, allocation.devices)
        listed = list(devices) if isinstance(devices, list) else []
        theirs = dict(entry)
        set_field(theirs, allocation.device_driver, where.other_driver)
        theirs["data"] = {"state": state}
        set_field(obj, allocation.devices, [*listed, theirs])
    refused = _with_existing(case, before)
    refused["request"]["body"] = after
    yield "changing another driver's status entry", refused


def _own_object(case: Case, verb: str, where: _Where) -> Iterator[Overstep]:
    """Another node's Node, another pod; a label key outside ``mayChange``."""
    request = case["request"]
    head, _, name = request["path"].rpartition("/")
    other = where.other_node if where.entry.rule is KindRule.OWN_NODE else f"{name}-other"
    if verb in ("get", "update", "patch") and name:
        refused = _refused(case, 403)
        refused["request"]["path"] = f"{head}/{other}"
        yield f"of another {'node' if where.entry.rule is KindRule.OWN_NODE else 'pod'}", refused
    body = request.get("body")
    if verb == "patch" and isinstance(body, dict) and where.spec.may_change:
        labelled = copy.deepcopy(body)
        labels = labelled.setdefault("metadata", {}).setdefault("labels", {})
        if isinstance(labels, dict):
            labels[_OUTSIDE_KEY] = "x"
            yield "setting a label key outside mayChange", _with_body(case, labelled)


def _on_node(case: Case, verb: str, where: _Where) -> Iterator[Overstep]:
    if verb in ("list", "watch"):
        yield from _pinned_lists(case, verb, where)
    elif existing := case.get("existing"):
        moved = _set(existing[0], where.spec.paths[Field.NODE], where.other_node)
        yield "of an object on another node", _with_existing(case, moved)


def _driver_namespace(case: Case, verb: str, where: _Where) -> Iterator[Overstep]:
    request = case["request"]
    head, found, rest = request["path"].partition("/namespaces/")
    if not found:
        return
    namespace, _, tail = rest.partition("/")
    other = "another-namespace" if namespace != "another-namespace" else "other-namespace"
    refused = _refused(case, 403)
    refused["request"]["path"] = f"{head}/namespaces/{other}/{tail}".rstrip("/")
    body = refused["request"].get("body")
    if isinstance(body, dict) and isinstance(body.get("metadata"), dict):
        body["metadata"]["namespace"] = other
    for obj in refused.get("existing", []):
        obj["metadata"]["namespace"] = other
    yield "in another namespace", refused


def _cel(case: Case, verb: str, where: _Where) -> Iterator[Overstep]:
    """Objects naming another driver, or another node's pools: outside the scope."""
    body = case["request"].get("body")
    if verb in ("create", "update") and isinstance(body, dict):
        yield "naming another driver", _with_body(case, where.other_drivers(body), code=None)
        yield "naming another node's pool", _with_body(case, where.elsewhere(body, ()), code=None)
    elif verb in ("get", "delete") and (existing := case.get("existing")):
        other = where.other_drivers(existing[0])
        yield "of an object naming another driver", _with_existing(case, other, code=None)


_BY_RULE: dict[KindRule, Callable[[Case, str, _Where], Iterator[Overstep]]] = {
    KindRule.NODE_LOCAL: _node_local,
    KindRule.ALLOCATED_TO_DRIVER: _allocated,
    KindRule.OWN_NODE: _own_object,
    KindRule.OWN_POD: _own_object,
    KindRule.ON_NODE: _on_node,
    KindRule.DRIVER_NAMESPACE: _driver_namespace,
    KindRule.CEL: _cel,
}
"""Rule DriverCredentials has none: the apiserver's RBAC for the driver decides."""


def _refused(case: Case, code: int | None) -> Case:
    refused = copy.deepcopy(case)
    expect: dict[str, Any] = {"allowed": False}
    if code is not None:
        expect["code"] = code
    expect["forwarded"] = None
    refused["expect"] = expect
    return refused


def _with_body(case: Case, body: Any, code: int | None = 403) -> Case:
    refused = _refused(case, code)
    refused["request"]["body"] = body
    return refused


def _with_existing(case: Case, stored: Any, code: int | None = 403) -> Case:
    refused = _refused(case, code)
    refused["existing"] = [stored, *refused["existing"][1:]]
    return refused


def _with_query(case: Case, info: RequestInfo, selector: str | None) -> Case:
    refused = _refused(case, 403)
    refused["request"]["query"] = info.with_query("fieldSelector", selector).query_string
    return refused


def _set(obj: Any, path: FieldPath, value: Any) -> Any:
    changed = copy.deepcopy(obj)
    set_field(changed, path, value)
    return changed


def _replace(obj: Any, under: FieldPath, change: Callable[[str], str | None]) -> Any:
    """A copy of ``obj`` whose strings under ``under`` are changed where ``change`` says."""
    copied = copy.deepcopy(obj)
    target = get_field(copied, under) if under else copied

    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: walk(item) for key, item in value.items()}
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, str):
            changed = change(value)
            return value if changed is None else changed
        return value

    if target is MISSING:
        return copied
    replaced = walk(target)
    if not under:
        return replaced
    set_field(copied, under, replaced)
    return copied
