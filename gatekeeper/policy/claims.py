"""Rule AllocatedToDriver (ResourceClaims in the default policy), purely (DESIGN §4.3).

A driver sees an object only when it carries an allocation result of the driver that is usable
on this node, and writes only through the ``status`` subresource, changing nothing but the
status-list entries it owns. Every field name comes from the policy (:class:`AllocationPaths`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gatekeeper.codec.jsonpath import MISSING, FieldPath, get_field
from gatekeeper.policy.changes import MAINTAINED, first_difference
from gatekeeper.policy.model import AllocationPaths
from gatekeeper.policy.nodeselector import selects_node
from gatekeeper.request.requestinfo import RequestInfo
from gatekeeper.rule import Rule, Violation
from gatekeeper.types import KubeObject

__all__ = [
    "CONTINUE_REFUSED",
    "OUT_OF_SCOPE",
    "STATUS",
    "AllocationScope",
    "request_refusal",
    "status_change_violation",
]

STATUS = "status"
"""The one subresource the rule writes through."""
OUT_OF_SCOPE = "not allocated to the driver on this node"
"""The reason (audit only) of the 404 that hides an object out of scope."""
CONTINUE_REFUSED = (
    "a filtered list is answered in full (limit is ignored) and hands out no continue token"
)
"""The reason of the 400 for a ``continue`` on a filtered list or watch: the apiserver's token
names the last key of its page, often an object hidden from the driver, so none is passed on,
and any presented is not one of the gatekeeper's."""

_READS = frozenset({"get", "list", "watch"})
_WRITES = frozenset({"update", "patch"})


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

    hidden: bool = field(default=True, init=False)
    """An object out of scope reads as absent (DESIGN §4.3)."""

    def stored(self, obj: KubeObject) -> Violation | None:
        return None if self(obj) else Violation(Rule.NOT_IN_SCOPE, OUT_OF_SCOPE)

    def written(self, obj: KubeObject, old: KubeObject | None) -> Violation | None:
        if old is None:
            return Violation(Rule.NOT_OWNER, "objects allocated to drivers are created by others")
        problem = status_change_violation(self.paths, old, obj, self.driver)
        return Violation(Rule.STATUS_ENTRIES, problem) if problem else None

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


def status_change_violation(
    paths: AllocationPaths, stored: KubeObject, proposed: KubeObject, driver: str
) -> str | None:
    """Why ``proposed`` changes more than ``driver``'s own entries of the status list, naming
    the first differing path; None when it does not.

    Values are compared by what the apiserver would store (:func:`first_difference` with the
    version's opaque paths), so that an official client's re-send of what it read passes.
    """
    devices = _dotted(paths.devices)
    rule = f"a driver may change only its own {devices} entries"
    opaque, times = paths.opaque, paths.times
    rest_stored, rest_proposed = _rest(stored, paths), _rest(proposed, paths)
    if difference := first_difference(rest_stored, rest_proposed, opaque=opaque, times=times):
        return f"{difference} differs from the stored object: {rule}"
    old, new = get_field(stored, paths.devices), get_field(proposed, paths.devices)
    old = [] if old is MISSING or old is None else old
    new = [] if new is MISSING or new is None else new
    if not isinstance(new, list) or not isinstance(old, list):
        return f"{devices} must be a list"
    others_old = [(i, e) for i, e in enumerate(old) if not _owned(e, paths, driver)]
    others_new = [(j, e) for j, e in enumerate(new) if not _owned(e, paths, driver)]
    for (_, before), (j, after) in zip(others_old, others_new, strict=False):
        where = f"{devices}[{j}]"
        found = first_difference(
            before, after, where, opaque=opaque, times=times, keys=paths.devices
        )
        if found:
            return f"{found} differs from the stored object ({_owner(before, paths)}): {rule}"
    if len(others_new) > len(others_old):
        j, entry = others_new[len(others_old)]
        return f"{devices}[{j}] is added for {_owner(entry, paths)}: {rule}"
    if len(others_old) > len(others_new):
        i, entry = others_old[len(others_new)]
        return f"{devices}[{i}] of {_owner(entry, paths)} is removed: {rule}"
    return None


def _rest(obj: KubeObject, paths: AllocationPaths) -> KubeObject:
    """``obj`` without the status list and the server-maintained fields (only the objects on
    those paths are copied; ``obj`` is not modified)."""
    rest = dict(obj)
    for path in (*sorted(MAINTAINED), paths.devices):
        parent = rest
        for key in path[:-1]:
            child = parent.get(key)
            if not isinstance(child, dict):
                break
            parent[key] = child = dict(child)
            parent = child
        else:
            parent.pop(path[-1], None)
    return rest


def _owned(entry: Any, paths: AllocationPaths, driver: str) -> bool:
    return isinstance(entry, dict) and get_field(entry, paths.device_driver) == driver


def _owner(entry: Any, paths: AllocationPaths) -> str:
    owner = get_field(entry, paths.device_driver) if isinstance(entry, dict) else MISSING
    if isinstance(owner, str):
        return f'driver "{owner}"'
    return f"no {_dotted(paths.device_driver)}"


def _dotted(path: FieldPath) -> str:
    return ".".join(path)
