"""Rule AllocatedToDriver (ResourceClaims in the default policy), purely (DESIGN §4.3).

A driver sees an object only when it carries an allocation result of the driver that is usable
on this node, and writes only through the ``status`` subresource, changing nothing but the
status-list entries it owns. Every field name comes from the policy (:class:`AllocationPaths`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from gatekeeper.codec.jsonpath import MISSING, FieldPath, get_field, is_field_name
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
    "first_difference",
    "request_refusal",
    "same_instant",
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


def first_difference(
    stored: Any,
    proposed: Any,
    prefix: str = "",
    *,
    opaque: tuple[FieldPath, ...] | None = None,
    times: tuple[FieldPath, ...] = (),
    keys: FieldPath = (),
) -> str | None:
    """The first path (in ``stored``'s key order, then ``proposed``'s new keys) where the two
    differ, like ``status.allocation.devices.results[0].device``; None when equal.

    With ``opaque=None`` the comparison is exact JSON equality (``true`` is not ``1``). With
    a tuple of opaque paths it is by meaning, as the apiserver stores it, everywhere except
    under those paths (``keys`` is where ``stored`` sits, list indexes left out):

    - at one of the ``times`` paths (where the apiserver stores a time), a string in the
      apiserver's canonical time form and a string denoting the same instant at that
      precision are equal (:func:`same_instant`); every other string is compared exactly,
      so that a time written into, say, another driver's condition message cannot be
      re-spelled;
    - a key whose stored value is null and which the proposed object leaves out is unchanged.

    Both are what the official Python client does when it re-sends an object it read (it
    writes ``+00:00`` times and drops null model attributes such as ``conditions: null``);
    client-go re-encodes with the apiserver's own Go types and so sends what it read.
    Under an opaque path (a RawExtension such as ``status.devices[].data``, kept byte for byte
    as sent, see recordings 180-181) every difference counts.
    """
    if stored == proposed and _json(stored) == _json(proposed):
        # Equal JSON (Python's == alone would take true for 1 and 1.0 for 1): done, without
        # walking the subtree.
        return None
    exact = opaque is None or any(keys[: len(path)] == path for path in opaque)
    if isinstance(stored, dict) and isinstance(proposed, dict):
        return _first_in_object(stored, proposed, prefix, exact, opaque, times, keys)
    if isinstance(stored, list) and isinstance(proposed, list):
        return _first_in_list(stored, proposed, prefix, opaque, times, keys)
    if type(stored) is type(proposed) and stored == proposed:
        return None
    if not exact and keys in times and isinstance(stored, str) and isinstance(proposed, str):
        return None if same_instant(stored, proposed) else prefix or "the object"
    return prefix or "the object"


def _first_in_object(
    stored: dict[str, Any],
    proposed: dict[str, Any],
    prefix: str,
    exact: bool,
    opaque: tuple[FieldPath, ...] | None,
    times: tuple[FieldPath, ...],
    keys: FieldPath,
) -> str | None:
    for key in [*stored, *(k for k in proposed if k not in stored)]:
        child = _child(prefix, key)
        if key not in proposed and stored[key] is None and not exact:
            continue  # null and absent decode alike into the apiserver's Go types
        if key not in stored or key not in proposed:
            return child
        found = first_difference(
            stored[key], proposed[key], child, opaque=opaque, times=times, keys=(*keys, str(key))
        )
        if found:
            return found
    return None


def _first_in_list(
    stored: list[Any],
    proposed: list[Any],
    prefix: str,
    opaque: tuple[FieldPath, ...] | None,
    times: tuple[FieldPath, ...],
    keys: FieldPath,
) -> str | None:
    for index in range(max(len(stored), len(proposed))):
        child = f"{prefix}[{index}]"
        if index >= len(stored) or index >= len(proposed):
            return child
        found = first_difference(
            stored[index], proposed[index], child, opaque=opaque, times=times, keys=keys
        )
        if found:
            return found
    return None


# RFC 3339 date-time as Go's time.RFC3339 parses it (upper-case T and Z, any fraction, ASCII
# digits only).
_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))$",
    re.ASCII,
)
# The forms the apiserver serves: metav1.Time (whole seconds) and metav1.MicroTime, in UTC.
_CANONICAL_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$", re.ASCII)
_CANONICAL_MICRO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$", re.ASCII)


def same_instant(stored: str, proposed: str) -> bool:
    """Whether ``proposed`` denotes the instant ``stored`` holds, as the apiserver stores it.

    Only when ``stored`` is in a form the apiserver serves its times in (``…:05Z``, or
    ``…:05.123456Z`` for MicroTime) and ``proposed`` parses as an RFC 3339 date-time: the
    apiserver stores a time in UTC at that precision, cutting finer digits (recordings
    186-187: ``2026-12-02T23:30:00.5+02:00`` is stored as ``2026-12-02T21:30:00Z``).
    Callers apply it only where the apiserver stores a time (the policy's ``times`` paths):
    elsewhere the apiserver keeps a string as sent, so a re-spelling is a change.
    """
    if _CANONICAL_MICRO.match(stored):
        unit = 1
    elif _CANONICAL_TIME.match(stored):
        unit = _MICROS
    else:
        return False
    want, got = _rfc3339_micros(stored), _rfc3339_micros(proposed)
    return want is not None and got is not None and got // unit * unit == want


_MICROS = 1_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# Year 0000 is valid RFC 3339 (and Go reads it) but below datetime's range: it is read 400 years
# on, one Gregorian cycle (146,097 days: the same calendar), and moved back.
_CYCLE_YEARS = 400
_CYCLE = timedelta(days=146_097)


def _rfc3339_micros(text: str) -> int | None:
    """Microseconds since the epoch (UTC) of an RFC 3339 date-time, digits past the
    microsecond cut; None if it is not one (no such day, hour 24, second 60, offset past 23:59).

    Arithmetic only: the policy package reads no clock (tests/policy/test_purity.py).
    """
    match = _RFC3339.match(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zulu, sign, off_hours, off_minutes = match.groups()[6:]
    offset = timedelta(0)
    if not zulu:
        if int(off_hours) > 23 or int(off_minutes) > 59:
            return None
        offset = timedelta(hours=int(off_hours), minutes=int(off_minutes))
        offset = -offset if sign == "-" else offset
    shift = _CYCLE_YEARS if year == 0 else 0
    try:
        moment = datetime(year + shift, month, day, hour, minute, second, tzinfo=timezone(offset))
    except ValueError:
        return None
    since = moment - _EPOCH - (_CYCLE if shift else timedelta(0))
    return since // _MICROSECOND + int((fraction or "").ljust(6, "0")[:6])


def _rest(obj: KubeObject, paths: AllocationPaths) -> KubeObject:
    """``obj`` without the status list and the server-maintained fields (only the objects on
    those paths are copied; ``obj`` is not modified)."""
    rest = dict(obj)
    for path in (*_SERVER_MAINTAINED, paths.devices):
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


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _child(prefix: str, key: Any) -> str:
    text = str(key)
    if is_field_name(text):
        return f"{prefix}.{text}" if prefix else text
    return f"{prefix}[{json.dumps(text)}]"


def _dotted(path: FieldPath) -> str:
    return ".".join(path)
