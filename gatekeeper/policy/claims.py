"""Rule AllocatedToDriver (ResourceClaims in the default policy), purely (DESIGN §4.3).

A driver sees an object only when it carries an allocation result of the driver that is usable
on this node, and writes only through the ``status`` subresource, changing nothing but the
status-list entries it owns. Every field name comes from the policy (:class:`AllocationPaths`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.jsonpath import MISSING, FieldPath, get_field, is_field_name
from gatekeeper.policy.decision import Decision, allow, forbid, not_found
from gatekeeper.policy.integrity import body_shape, patch_result, pinned_update
from gatekeeper.policy.model import AllocationPaths, KindSpec
from gatekeeper.policy.nodeselector import selects_node
from gatekeeper.policy.plan import Preview
from gatekeeper.requestinfo import RequestInfo
from gatekeeper.types import KubeObject

__all__ = [
    "OUT_OF_SCOPE",
    "STATUS",
    "AllocationScope",
    "decide_allocated",
    "first_difference",
    "request_refusal",
    "status_change_violation",
]

STATUS = "status"
"""The one subresource the rule writes through."""
OUT_OF_SCOPE = "not allocated to the driver on this node"
"""The reason (audit only) of the 404 that hides an object out of scope."""

_READS = frozenset({"get", "list", "watch"})
_WRITES = frozenset({"update", "patch"})
# Fields the apiserver maintains on every write: a difference there is not a change.
_SERVER_MAINTAINED: tuple[FieldPath, ...] = (
    ("metadata", "resourceVersion"),
    ("metadata", "managedFields"),
)


@dataclass(frozen=True, slots=True)
class AllocationScope:
    """What one driver may see on this node; call it on an object (the Decision's filter).

    In scope: some entry of ``results`` has ``result_driver`` = the driver, and the
    ``node_selector`` selects this node (by ``metadata.name`` or by the node's labels). An
    object without a node selector is out of scope: a node-local driver has no business with
    an allocation that is not tied to its node.
    """

    paths: AllocationPaths
    driver: str
    node_name: str
    node_labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __call__(self, obj: Any) -> bool:
        if not isinstance(obj, dict):
            return False
        results = get_field(obj, self.paths.results)
        if not isinstance(results, list) or not any(
            isinstance(result, dict) and get_field(result, self.paths.result_driver) == self.driver
            for result in results
        ):
            return False
        selector = get_field(obj, self.paths.node_selector)
        return selects_node(selector, self.node_name, self.node_labels)


def request_refusal(info: RequestInfo) -> str | None:
    """Why the rule refuses this request whatever the object (None when it may proceed)."""
    if info.verb in _READS:
        return None
    if info.verb in _WRITES and info.subresource == STATUS:
        return None
    if info.verb in _WRITES:
        return (
            "objects allocated to drivers are written only through the status subresource "
            f"(.../{STATUS})"
        )
    return f"{info.verb} is not allowed: objects allocated to drivers are managed by others"


def decide_allocated(
    scope: AllocationScope,
    info: RequestInfo,
    kind: KindSpec,
    body: Any,
    current: KubeObject | None,
    *,
    media_type: str,
    proposed: Preview | None,
) -> Decision:
    """Decide a request :func:`request_refusal` let through, for the caller ``scope.driver``;
    ``proposed`` is a patch's preview with the upstream's answer, if there was one."""
    if info.verb in ("list", "watch"):
        return allow(
            "objects are filtered to the driver's allocations on this node", info, filter=scope
        )
    if current is None:
        return not_found(info, kind.qualified)
    if not scope(current):
        # SECURITY: DESIGN §4.3 — an object out of scope answers as absent (the same Status),
        # so that a driver cannot learn which other claims exist.
        return not_found(info, kind.qualified, OUT_OF_SCOPE)
    if info.verb == "get":
        return allow("allocated to the driver on this node", info, filter=scope)
    if info.verb == "update":
        return _update_status(scope, info, kind, body, current)
    if info.verb == "patch":
        return _patch_status(scope, info, kind, body, current, media_type, proposed)
    return forbid(scope.driver, info, request_refusal(info) or f"{info.verb} is not allowed")


def _update_status(
    scope: AllocationScope, info: RequestInfo, kind: KindSpec, body: Any, current: KubeObject
) -> Decision:
    if refusal := body_shape(info, kind, body):
        return refusal
    pinned = pinned_update(info, kind, body, current)
    if isinstance(pinned, Decision):
        return pinned
    if problem := status_change_violation(scope.paths, current, pinned, scope.driver):
        return forbid(scope.driver, info, problem)
    return allow("only the driver's own status entries change", info, pinned)


def _patch_status(
    scope: AllocationScope,
    info: RequestInfo,
    kind: KindSpec,
    patch: Any,
    current: KubeObject,
    media_type: str,
    proposed: Preview | None,
) -> Decision:
    prepared = patch_result(info, kind, patch, current, media_type, proposed)
    if isinstance(prepared, Decision):
        return prepared
    result, pinned = prepared
    if problem := status_change_violation(scope.paths, current, result, scope.driver):
        return forbid(scope.driver, info, f"after the patch, {problem}")
    return allow("only the driver's own status entries change", info, pinned, media_type)


def status_change_violation(
    paths: AllocationPaths, stored: KubeObject, proposed: KubeObject, driver: str
) -> str | None:
    """Why ``proposed`` changes more than ``driver``'s own entries of the status list, naming
    the first differing path; None when it does not."""
    devices = _dotted(paths.devices)
    rule = f"a driver may change only its own {devices} entries"
    if difference := first_difference(_rest(stored, paths), _rest(proposed, paths)):
        return f"{difference} differs from the stored object: {rule}"
    old, new = get_field(stored, paths.devices), get_field(proposed, paths.devices)
    old = [] if old is MISSING or old is None else old
    new = [] if new is MISSING or new is None else new
    if not isinstance(new, list) or not isinstance(old, list):
        return f"{devices} must be a list"
    others_old = [(i, e) for i, e in enumerate(old) if not _owned(e, paths, driver)]
    others_new = [(j, e) for j, e in enumerate(new) if not _owned(e, paths, driver)]
    for (_, before), (j, after) in zip(others_old, others_new, strict=False):
        if before != after:
            where = first_difference(before, after, f"{devices}[{j}]")
            return f"{where} differs from the stored object ({_owner(before, paths)}): {rule}"
    if len(others_new) > len(others_old):
        j, entry = others_new[len(others_old)]
        return f"{devices}[{j}] is added for {_owner(entry, paths)}: {rule}"
    if len(others_old) > len(others_new):
        i, entry = others_old[len(others_new)]
        return f"{devices}[{i}] of {_owner(entry, paths)} is removed: {rule}"
    return None


def first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    """The first path (in ``a``'s key order, then ``b``'s new keys) where ``a`` and ``b``
    differ, like ``status.allocation.devices.results[0].device``; None when equal."""
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            child = _child(prefix, key)
            if key not in a or key not in b:
                return child
            if found := first_difference(a[key], b[key], child):
                return found
    elif isinstance(a, list) and isinstance(b, list):
        for index in range(max(len(a), len(b))):
            child = f"{prefix}[{index}]"
            if index >= len(a) or index >= len(b):
                return child
            if found := first_difference(a[index], b[index], child):
                return found
    return prefix or "the object"


def _rest(obj: KubeObject, paths: AllocationPaths) -> KubeObject:
    """``obj`` without the status list and the server-maintained fields."""
    rest = copy.deepcopy(obj)
    for path in (*_SERVER_MAINTAINED, paths.devices):
        parent = get_field(rest, path[:-1])
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
    return rest


def _owned(entry: Any, paths: AllocationPaths, driver: str) -> bool:
    return isinstance(entry, dict) and get_field(entry, paths.device_driver) == driver


def _owner(entry: Any, paths: AllocationPaths) -> str:
    owner = get_field(entry, paths.device_driver) if isinstance(entry, dict) else MISSING
    if isinstance(owner, str):
        return f'driver "{owner}"'
    return f"no {_dotted(paths.device_driver)}"


def _child(prefix: str, key: Any) -> str:
    text = str(key)
    if is_field_name(text):
        return f"{prefix}.{text}" if prefix else text
    return f"{prefix}[{json.dumps(text)}]"


def _dotted(path: FieldPath) -> str:
    return ".".join(path)
